//! What a backward pass computed, read from its gradient store. Shared by the integration tests
//! and the model's unit tests (`src/model.rs` includes this file).

/// The shapes of the matrices a gradient store holds, read from its debug output
/// (`Tensor[dims 32, 64; f64]`): what the backward pass computed, whether or not anything asks
/// for it.
pub fn matrix_shapes(store: &candle_core::backprop::GradStore) -> Vec<[usize; 2]> {
    let text = format!("{store:?}");
    text.split("dims ")
        .skip(1)
        .filter_map(|rest| {
            let dims: Vec<usize> = rest
                .split(';')
                .next()?
                .split(", ")
                .map(str::parse)
                .collect::<std::result::Result<_, _>>()
                .ok()?;
            <[usize; 2]>::try_from(dims).ok()
        })
        .collect()
}
