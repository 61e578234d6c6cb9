//! Results handed to Python without a copy: a vector built here, exported read-only through
//! the buffer protocol, so that `pa.py_buffer` or `np.frombuffer` wrap the very memory.

use std::ffi::{c_int, c_void};
use std::sync::Mutex;

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

/// Result vectors that Python has let go of, kept for the next call: a decode writes hundreds
/// of bytes per record, and memory fresh from the system costs a page fault per 4 KiB, which
/// was as much as the decoding itself. Bounded, so an idle process holds little.
pub struct Pool<T> {
    free: Mutex<Vec<Vec<T>>>,
}

const POOL_BYTES: usize = 96 << 20; // per element type
const POOL_BUFFERS: usize = 64;

impl<T> Pool<T> {
    const fn new() -> Self {
        Pool {
            free: Mutex::new(Vec::new()),
        }
    }

    fn take(&self, capacity: usize) -> Vec<T> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        // The smallest vector that is large enough, else the largest there is.
        let pick = free
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= capacity)
            .min_by_key(|(_, v)| v.capacity())
            .or_else(|| free.iter().enumerate().max_by_key(|(_, v)| v.capacity()))
            .map(|(i, _)| i);
        let mut v = match pick {
            Some(i) => free.swap_remove(i),
            None => Vec::new(),
        };
        drop(free);
        v.clear();
        v.reserve(capacity);
        v
    }

    fn give(&self, v: Vec<T>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let held: usize = free.iter().map(|v| v.capacity()).sum();
        let size = std::mem::size_of::<T>();
        if free.len() < POOL_BUFFERS && (held + v.capacity()) * size <= POOL_BYTES {
            free.push(v);
        }
    }
}

static POOL_U8: Pool<u8> = Pool::new();
static POOL_I32: Pool<i32> = Pool::new();
static POOL_I64: Pool<i64> = Pool::new();

/// A vector of at least `capacity` elements' room, recycled when one is free.
pub trait Recycled: Sized + 'static {
    fn pool() -> &'static Pool<Self>;
    fn take(capacity: usize) -> Vec<Self> {
        Self::pool().take(capacity)
    }
}

impl Recycled for u8 {
    fn pool() -> &'static Pool<u8> {
        &POOL_U8
    }
}
impl Recycled for i32 {
    fn pool() -> &'static Pool<i32> {
        &POOL_I32
    }
}
impl Recycled for i64 {
    fn pool() -> &'static Pool<i64> {
        &POOL_I64
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.data, Data::U8(Vec::new())) {
            Data::U8(v) => POOL_U8.give(v),
            Data::I32(v) => POOL_I32.give(v),
            Data::I64(v) => POOL_I64.give(v),
        }
    }
}

/// A read-only buffer owning one result vector. Immutable once built (`frozen`), so the
/// memory it exports never moves while a consumer holds a view of it.
#[pyclass(module = "rocketstore.pipeline._native", frozen)]
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
