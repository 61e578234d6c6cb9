//! rocketstore's native core: the per-message work of the store, exposed to Python as
//! `rocketstore.pipeline._native`.
//!
//! Python keeps the orchestration (files, placement, recovery decisions, Spark); every loop
//! over messages lives here and runs with the GIL released. Inputs arrive as buffers borrowed
//! from numpy, Arrow or a segment's mapping (see [`buffers`]); nothing is copied on the way
//! in. Bad arguments (an output buffer that overlaps an input among them) raise `ValueError`.
//! Every entry point runs under [`guarded`], so a panic (a bug, or a borrowed buffer changed
//! under us) reaches Python as `rocketstore.pipeline.errors.NativeError`, a `StoreError`, never as PyO3's
//! `PanicException`, which `except Exception` would miss.

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

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::prelude::*;
use pyo3::types::PyType;

/// Run `f`, turning a panic into `rocketstore.pipeline.errors.NativeError` naming `what`. The closure's
/// state is not used after a panic (the error goes straight to Python), which is why asserting
/// unwind safety is sound here.
pub fn guarded<T>(what: &str, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => Err(native_error(what, &panic_text(payload.as_ref()))),
    }
}

/// The message a panic carried.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Panics under [`guarded`]: lets the tests see a panic reach Python as `NativeError`.
#[pyfunction]
fn _panic_under_guard() -> PyResult<()> {
    guarded("_panic_under_guard", || panic!("as asked"))
}

fn native_error(what: &str, text: &str) -> PyErr {
    let message = format!("{what}: internal error in the native core: {text}");
    Python::attach(|py| {
        let class = py
            .import("rocketstore.pipeline.errors")
            .and_then(|m| m.getattr("NativeError"))
            .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
        match class {
            Ok(class) => PyErr::from_type(class, message),
            Err(e) => e,
        }
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<encode::EncodeBatch>()?;
    m.add_function(wrap_pyfunction!(encode::body_crcs, m)?)?;
    m.add_function(wrap_pyfunction!(encode::java_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(encode::index_keys, m)?)?;
    m.add_function(wrap_pyfunction!(encode::uniq_ids, m)?)?;
    m.add_class::<single::SinglePut>()?;
    m.add_function(wrap_pyfunction!(index::index_put, m)?)?;
    m.add_function(wrap_pyfunction!(index::index_mend, m)?)?;
    m.add_function(wrap_pyfunction!(scan::walk, m)?)?;
    m.add_function(wrap_pyfunction!(redispatch::dispatch_walk, m)?)?;
    m.add_class::<owned::Owned>()?;
    m.add_function(wrap_pyfunction!(decode::decode, m)?)?;
    m.add_function(wrap_pyfunction!(decode::decode_one, m)?)?;
    m.add_function(wrap_pyfunction!(decode::record_starts, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_under_guard, m)?)?;
    for (name, value) in layout::EXPORTED {
        m.add(name, value)?;
    }
    m.add("UNIT_SIZE", layout::UNIT_SIZE)?;
    m.add("INDEX_HEADER_SIZE", index::HEADER_SIZE)?;
    m.add("INDEX_SLOT_SIZE", index::SLOT_SIZE)?;
    m.add("INDEX_ENTRY_SIZE", index::ENTRY_SIZE)?;
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
