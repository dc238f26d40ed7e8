//! Row offsets over flat per-token arrays, and input checks.

use crate::error::{AlgoError, Location, Result};

/// Rows of a batch as offsets into flat per-token arrays: row `i` owns tokens
/// `offsets[i]..offsets[i + 1]` (relative to `offsets[0]`, so a slice of a larger batch's offsets
/// can be used as is). `first_row` is the index of row 0 in the enclosing batch; it is used in
/// error messages and by the `verl` aggregation normaliser.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a> {
    offsets: &'a [usize],
    first_row: usize,
}

impl<'a> Rows<'a> {
    /// Checks that `offsets` is non-empty and non-decreasing.
    pub fn new(offsets: &'a [usize], first_row: usize) -> Result<Self> {
        if offsets.is_empty() {
            return Err(AlgoError::Shape(
                "offsets must have rows + 1 entries (got none)".into(),
            ));
        }
        if let Some(i) = offsets.windows(2).position(|w| w[1] < w[0]) {
            return Err(AlgoError::Shape(format!(
                "offsets decrease at row {}: {} > {}",
                first_row + i,
                offsets[i],
                offsets[i + 1]
            )));
        }
        Ok(Self { offsets, first_row })
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total number of tokens (valid or not).
    pub fn tokens(&self) -> usize {
        self.offsets[self.offsets.len() - 1] - self.offsets[0]
    }

    /// Index of row 0 in the enclosing batch.
    pub fn first_row(&self) -> usize {
        self.first_row
    }

    /// Flat index range of row `i` in the per-token arrays.
    pub fn range(&self, i: usize) -> std::ops::Range<usize> {
        (self.offsets[i] - self.offsets[0])..(self.offsets[i + 1] - self.offsets[0])
    }

    /// Checks that a per-token array has one entry per token.
    pub fn check_tokens<T>(&self, field: &str, xs: &[T]) -> Result<()> {
        if xs.len() != self.tokens() {
            return Err(AlgoError::Shape(format!(
                "`{field}` has {} values, the offsets describe {} tokens",
                xs.len(),
                self.tokens()
            )));
        }
        Ok(())
    }

    /// Checks that a per-row array has one entry per row.
    pub fn check_rows<T>(&self, field: &str, xs: &[T]) -> Result<()> {
        if xs.len() != self.len() {
            return Err(AlgoError::Shape(format!(
                "`{field}` has {} values for {} rows",
                xs.len(),
                self.len()
            )));
        }
        Ok(())
    }

    /// Checks length and finiteness of a per-token array; the error names row and token.
    pub fn check_finite_tokens(&self, field: &'static str, xs: &[f64]) -> Result<()> {
        self.check_tokens(field, xs)?;
        for i in 0..self.len() {
            let r = self.range(i);
            let start = r.start;
            if let Some(t) = xs[r].iter().position(|v| !v.is_finite()) {
                return Err(AlgoError::NonFinite {
                    at: Location {
                        field,
                        row: self.first_row + i,
                        token: Some(t),
                    },
                    value: xs[start + t],
                });
            }
        }
        Ok(())
    }

    /// Checks length and finiteness of a per-row array; the error names the row.
    pub fn check_finite_rows(&self, field: &'static str, xs: &[f64]) -> Result<()> {
        self.check_rows(field, xs)?;
        if let Some(i) = xs.iter().position(|v| !v.is_finite()) {
            return Err(AlgoError::NonFinite {
                at: Location {
                    field,
                    row: self.first_row + i,
                    token: None,
                },
                value: xs[i],
            });
        }
        Ok(())
    }

    /// Validity of every token: `mask`, or all true.
    pub fn valid(&self, mask: Option<&[bool]>) -> Result<Vec<bool>> {
        match mask {
            Some(m) => {
                self.check_tokens("mask", m)?;
                Ok(m.to_vec())
            }
            None => Ok(vec![true; self.tokens()]),
        }
    }
}
