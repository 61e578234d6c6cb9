//! rocketstore's native core: the per-message work of the store, exposed to Python as
//! `pipeline._native`.
//!
//! Python keeps the orchestration (files, placement, recovery decisions, Spark); every loop
//! over messages lives here and runs with the GIL released. Inputs arrive as buffers borrowed
//! from numpy, Arrow or a segment's mapping (see [`buffers`]); nothing is copied on the way
//! in. Bad arguments raise `ValueError`; a panic surfaces as PyO3's `PanicException`, which
//! the Python wrappers in `pipeline/native.py` turn into the store's own errors.

mod buffers;
mod decode;
mod encode;
mod hash;
mod index;
mod layout;
mod owned;
mod redispatch;
mod scan;
mod single;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<encode::EncodeBatch>()?;
    m.add_function(wrap_pyfunction!(encode::body_crcs, m)?)?;
    m.add_function(wrap_pyfunction!(encode::java_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(encode::index_keys, m)?)?;
    m.add_function(wrap_pyfunction!(encode::uniq_ids, m)?)?;
    m.add_class::<single::SinglePut>()?;
    m.add_function(wrap_pyfunction!(index::index_put, m)?)?;
    m.add_function(wrap_pyfunction!(scan::walk, m)?)?;
    m.add_function(wrap_pyfunction!(redispatch::dispatch_walk, m)?)?;
    m.add_class::<owned::Owned>()?;
    m.add_function(wrap_pyfunction!(decode::decode, m)?)?;
    m.add_function(wrap_pyfunction!(decode::record_starts, m)?)?;
    for (name, bit) in [
        ("DECODE_BODY", decode::BODY),
        ("DECODE_PROPERTIES", decode::PROPERTIES),
        ("DECODE_KEYS", decode::KEYS),
        ("DECODE_TAGS", decode::TAGS),
        ("DECODE_UNIQ_KEY", decode::UNIQ_KEY),
        ("DECODE_HOSTS", decode::HOSTS),
        ("DECODE_MSG_ID", decode::MSG_ID),
    ] {
        m.add(name, bit)?;
    }
    Ok(())
}
