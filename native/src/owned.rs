//! Results handed to Python without a copy: a vector built here, exported read-only through
//! the buffer protocol, so that `pa.py_buffer` or `np.frombuffer` wrap the very memory.

use std::ffi::{c_int, c_void};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// The vectors a result can be: Arrow data and validity bytes, int32 and int64 values.
pub enum Data {
    U8(Vec<u8>),
    I32(Vec<i32>),
    I64(Vec<i64>),
}

impl Data {
    fn raw(&self) -> (*const u8, usize) {
        match self {
            Data::U8(v) => (v.as_ptr(), v.len()),
            Data::I32(v) => (v.as_ptr() as *const u8, std::mem::size_of_val(v.as_slice())),
            Data::I64(v) => (v.as_ptr() as *const u8, std::mem::size_of_val(v.as_slice())),
        }
    }
}

/// A read-only buffer owning one result vector. Immutable once built (`frozen`), so the
/// memory it exports never moves while a consumer holds a view of it.
#[pyclass(module = "pipeline._native", frozen)]
pub struct Owned {
    data: Data,
}

impl Owned {
    pub fn new(data: Data) -> Self {
        Owned { data }
    }
}

#[pymethods]
impl Owned {
    fn __len__(&self) -> usize {
        self.data.raw().1
    }

    /// # Safety
    /// Called by CPython with a valid `view` to fill, per the buffer protocol.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("view is null"));
        }
        let (ptr, len) = slf.get().data.raw();
        // SAFETY: `view` is non-null and CPython's to fill; `ptr` and `len` describe the
        // vector `slf` owns, which is never mutated or moved while `slf` lives (the class is
        // frozen), and `PyBuffer_FillInfo` takes a reference to `slf` that the view holds.
        // Read-only (1): a consumer asking for a writable buffer gets an error.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                ptr as *mut c_void,
                len as ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if rc == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    /// # Safety
    /// Nothing to release: the view borrows the vector, which `slf` owns.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
