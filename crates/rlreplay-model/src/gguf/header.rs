//! A bounded scan of a GGUF header, run before candle's reader sees the file.
//!
//! candle's reader allocates by the counts and lengths the header declares and trusts the layout
//! (an alignment of 0 divides by zero, a tensor's element count may overflow). This scan reads
//! the same header with every count, length and size checked against the bytes left in the file
//! and against fixed limits, skipping values instead of reading them, so a damaged or hostile
//! file is refused with an error naming the key or tensor before anything large is allocated.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use candle_core::quantized::GgmlDType;

use crate::{Error, Result};

/// Most tensors a file may declare.
const MAX_TENSORS: u64 = 1 << 16;
/// Most metadata entries a file may declare.
const MAX_KVS: u64 = 1 << 16;
/// Longest metadata key or tensor name, in bytes.
const MAX_NAME: u64 = 1 << 16;
/// Most array elements over all metadata (each becomes a 32-byte value in candle's reader, so at
/// most 128 MiB of them; the largest vocabularies, with scores, types and merges, take about 1 M).
const MAX_ARRAY_ELEMENTS: u64 = 1 << 22;
/// Deepest nesting of arrays in arrays.
const MAX_DEPTH: usize = 4;
/// Most dimensions of a tensor.
const MAX_DIMS: u32 = 4;
/// The alignment of tensor data when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: u64 = 32;

/// One tensor of the file, as its header describes it.
#[derive(Debug, Clone)]
pub(crate) struct TensorEntry {
    /// The GGUF tensor name.
    pub name: String,
    /// Its storage type.
    pub dtype: GgmlDType,
    /// Dimensions, outermost first (GGUF lists them innermost first; candle reverses them too).
    pub dims: Vec<usize>,
}

/// What the scan learned: the tensors, in file order.
#[derive(Debug)]
pub(crate) struct Header {
    /// The tensors.
    pub tensors: Vec<TensorEntry>,
}

/// The name of a ggml type id, for errors about types that cannot be converted.
fn type_name(id: u32) -> Option<&'static str> {
    Some(match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return None,
    })
}

/// The types the converter dequantizes (through candle), by ggml type id.
fn supported_type(id: u32) -> Option<GgmlDType> {
    Some(match id {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        30 => GgmlDType::BF16,
        _ => return None,
    })
}

/// The name of a supported type as ggml spells it (`Q4_K`, not candle's `Q4K`).
pub(crate) fn dtype_name(dtype: GgmlDType) -> &'static str {
    match dtype {
        GgmlDType::F32 => "F32",
        GgmlDType::F16 => "F16",
        GgmlDType::BF16 => "BF16",
        GgmlDType::Q4_0 => "Q4_0",
        GgmlDType::Q4_1 => "Q4_1",
        GgmlDType::Q5_0 => "Q5_0",
        GgmlDType::Q5_1 => "Q5_1",
        GgmlDType::Q8_0 => "Q8_0",
        GgmlDType::Q8_1 => "Q8_1",
        GgmlDType::Q2K => "Q2_K",
        GgmlDType::Q3K => "Q3_K",
        GgmlDType::Q4K => "Q4_K",
        GgmlDType::Q5K => "Q5_K",
        GgmlDType::Q6K => "Q6_K",
        GgmlDType::Q8K => "Q8_K",
    }
}

/// A reader that knows how many bytes the file has left.
struct Scanner {
    r: BufReader<File>,
    pos: u64,
    size: u64,
    file: String,
    /// Array elements seen so far, over all metadata.
    elements: u64,
}

impl Scanner {
    fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::Checkpoint(format!("{}: {msg}", self.file))
    }

    fn left(&self) -> u64 {
        self.size.saturating_sub(self.pos)
    }

    /// Errors unless `n` more bytes are in the file.
    fn need(&self, n: u64, what: &dyn Fn() -> String) -> Result<()> {
        if n > self.left() {
            return Err(self.err(format!(
                "truncated or corrupt: {} needs {n} bytes at offset {}, the file has {} left",
                what(),
                self.pos,
                self.left()
            )));
        }
        Ok(())
    }

    fn bytes<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        self.need(N as u64, what)?;
        let mut b = [0u8; N];
        self.r
            .read_exact(&mut b)
            .map_err(|e| self.err(format!("reading {}: {e}", what())))?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        self.bytes::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        self.bytes::<8>(what).map(u64::from_le_bytes)
    }

    fn skip(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<()> {
        self.need(n, what)?;
        let step = i64::try_from(n).map_err(|_| self.err(format!("{} is too long", what())))?;
        self.r
            .seek_relative(step)
            .map_err(|e| self.err(format!("seeking past {}: {e}", what())))?;
        self.pos += n;
        Ok(())
    }

    /// A length-prefixed string of at most `max` bytes, read.
    fn string(&mut self, max: u64, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.u64(&|| format!("the length of {}", what()))?;
        if len > max {
            return Err(self.err(format!(
                "{} has length {len}, more than the limit {max}",
                what()
            )));
        }
        self.need(len, what)?;
        let mut v = vec![0u8; len as usize];
        self.r
            .read_exact(&mut v)
            .map_err(|e| self.err(format!("reading {}: {e}", what())))?;
        self.pos += len;
        Ok(String::from_utf8_lossy(&v).into_owned())
    }

    /// Skips one metadata value of type `ty` (GGUF value-type id), checking its lengths.
    fn skip_value(&mut self, ty: u32, depth: usize, key: &str) -> Result<()> {
        let what = || format!("the value of {key}");
        match ty {
            0 | 1 => self.skip(1, &what),
            7 => match self.bytes::<1>(&what)?[0] {
                0 | 1 => Ok(()),
                b => Err(self.err(format!("{key}: invalid boolean byte {b}"))),
            },
            2 | 3 => self.skip(2, &what),
            4..=6 => self.skip(4, &what),
            10..=12 => self.skip(8, &what),
            8 => {
                let len = self.u64(&|| format!("the string length of {key}"))?;
                self.skip(len, &what)
            }
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(self.err(format!(
                        "{key}: arrays nested deeper than {MAX_DEPTH} levels"
                    )));
                }
                let elem = self.u32(&|| format!("the element type of {key}"))?;
                let len = self.u64(&|| format!("the array length of {key}"))?;
                let min = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    other => {
                        return Err(self.err(format!("{key}: unknown array element type {other}")))
                    }
                };
                self.need(len.saturating_mul(min), &|| {
                    format!("the {len} elements of the array {key}")
                })?;
                self.elements = self.elements.saturating_add(len);
                if self.elements > MAX_ARRAY_ELEMENTS {
                    return Err(self.err(format!(
                        "{key}: the metadata arrays hold more than {MAX_ARRAY_ELEMENTS} elements"
                    )));
                }
                match elem {
                    7..=9 => {
                        for _ in 0..len {
                            self.skip_value(elem, depth + 1, key)?;
                        }
                        Ok(())
                    }
                    _ => self.skip(len * min, &what),
                }
            }
            other => Err(self.err(format!("{key}: unknown value type {other}"))),
        }
    }

    /// Reads the value of `general.alignment` (any integer type candle accepts).
    fn alignment(&mut self, ty: u32) -> Result<u64> {
        let what = || "general.alignment".to_string();
        let v = match ty {
            0 => u64::from(self.bytes::<1>(&what)?[0]),
            1 => i8::from_le_bytes(self.bytes::<1>(&what)?) as u64,
            2 => u64::from(u16::from_le_bytes(self.bytes::<2>(&what)?)),
            3 => i16::from_le_bytes(self.bytes::<2>(&what)?) as u64,
            4 => u64::from(self.u32(&what)?),
            5 => i32::from_le_bytes(self.bytes::<4>(&what)?) as u64,
            other => {
                return Err(self.err(format!(
                    "general.alignment has value type {other}, expected a 32-bit unsigned integer"
                )))
            }
        };
        if v == 0 || !v.is_power_of_two() || v > 1 << 20 {
            return Err(self.err(format!(
                "general.alignment = {} is not a power of two (at most 1 MiB)",
                v as i64
            )));
        }
        Ok(v)
    }
}

/// Scans the header of the GGUF file at `path` (see the module documentation).
pub(crate) fn scan(path: &Path) -> Result<Header> {
    let file_name = path.display().to_string();
    let f = File::open(path).map_err(|e| Error::Io(format!("opening {file_name}: {e}")))?;
    let size = f
        .metadata()
        .map_err(|e| Error::Io(format!("reading {file_name}: {e}")))?
        .len();
    let mut s = Scanner {
        r: BufReader::new(f),
        pos: 0,
        size,
        file: file_name,
        elements: 0,
    };
    let magic = s.bytes::<4>(&|| "the magic number".to_string())?;
    if &magic != b"GGUF" {
        return Err(s.err(format!(
            "not a GGUF file (magic bytes {magic:02x?}, expected \"GGUF\")"
        )));
    }
    let version = s.u32(&|| "the version".to_string())?;
    if !(2..=3).contains(&version) {
        return Err(s.err(format!(
            "unsupported GGUF version {version} (supported: 2 and 3, little-endian)"
        )));
    }
    let n_tensors = s.u64(&|| "the tensor count".to_string())?;
    let n_kvs = s.u64(&|| "the metadata count".to_string())?;
    if n_tensors > MAX_TENSORS {
        return Err(s.err(format!(
            "the header declares {n_tensors} tensors, more than the limit {MAX_TENSORS}"
        )));
    }
    if n_kvs > MAX_KVS {
        return Err(s.err(format!(
            "the header declares {n_kvs} metadata entries, more than the limit {MAX_KVS}"
        )));
    }
    // Smallest entries: a key (length, 1 byte), a type and a 1-byte value; a name (length, 1
    // byte), a dimension count, one dimension, a type and an offset.
    let least = n_kvs * (8 + 1 + 4 + 1) + n_tensors * (8 + 1 + 4 + 8 + 4 + 8);
    s.need(least, &|| {
        format!("{n_kvs} metadata entries and {n_tensors} tensor descriptions")
    })?;

    let mut keys = HashSet::new();
    let mut alignment = DEFAULT_ALIGNMENT;
    for i in 0..n_kvs {
        let key = s.string(MAX_NAME, &|| format!("metadata key #{i}"))?;
        let ty = s.u32(&|| format!("the value type of {key}"))?;
        if key == "general.alignment" {
            alignment = s.alignment(ty)?;
        } else {
            s.skip_value(ty, 0, &key)?;
        }
        if !keys.insert(key.clone()) {
            return Err(s.err(format!("metadata key {key} appears twice")));
        }
    }

    let mut names = HashSet::new();
    let mut raw = Vec::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let name = s.string(MAX_NAME, &|| format!("the name of tensor #{i}"))?;
        let n_dims = s.u32(&|| format!("the dimension count of tensor {name}"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(s.err(format!(
                "tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS} supported)"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(s.u64(&|| format!("the dimensions of tensor {name}"))?);
        }
        let type_id = s.u32(&|| format!("the type of tensor {name}"))?;
        let offset = s.u64(&|| format!("the data offset of tensor {name}"))?;
        let Some(dtype) = supported_type(type_id) else {
            let kind = match type_name(type_id) {
                Some(n) => format!("type {n}"),
                None => format!("unknown type id {type_id}"),
            };
            return Err(s.err(format!(
                "tensor {name} has {kind}, which cannot be converted (supported: F32, F16, BF16, \
                 Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)"
            )));
        };
        if !names.insert(name.clone()) {
            return Err(s.err(format!("tensor {name} appears twice")));
        }
        let ggml_dims = format!("{dims:?}");
        let elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n > 0 && usize::try_from(n).is_ok())
            .ok_or_else(|| {
                s.err(format!(
                    "tensor {name} has dimensions {ggml_dims}, an empty or impossibly large tensor"
                ))
            })?;
        let block = dtype.block_size() as u64;
        if dims[0] % block != 0 {
            return Err(s.err(format!(
                "tensor {name} ({}) has rows of {} elements, not a multiple of the block size \
                 {block}",
                dtype_name(dtype),
                dims[0]
            )));
        }
        let bytes = elements / block * dtype.type_size() as u64;
        if offset % alignment != 0 {
            return Err(s.err(format!(
                "tensor {name} has data offset {offset}, not a multiple of the alignment \
                 {alignment}"
            )));
        }
        let dims: Vec<usize> = dims.iter().rev().map(|&d| d as usize).collect();
        raw.push((TensorEntry { name, dtype, dims }, offset, bytes));
    }
    let data_start = s.pos.div_ceil(alignment) * alignment;
    let mut tensors = Vec::with_capacity(raw.len());
    for (entry, offset, bytes) in raw {
        let end = data_start
            .checked_add(offset)
            .and_then(|start| start.checked_add(bytes));
        if end.is_none_or(|end| end > size) {
            return Err(s.err(format!(
                "tensor {} ({}, {bytes} bytes at offset {offset} of the data starting at byte \
                 {data_start}) runs past the end of the file ({size} bytes): truncated or corrupt",
                entry.name,
                dtype_name(entry.dtype)
            )));
        }
        tensors.push(entry);
    }
    Ok(Header { tensors })
}
