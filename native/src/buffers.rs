//! Borrowing Python buffers (numpy arrays, Arrow buffers, mmap views) as Rust slices.
//!
//! Every column crosses from Python as an object that exports the buffer protocol, so no data
//! is copied on the way in. A `PyBuffer` keeps the exporter alive and, for `mmap`, pins the
//! mapping: Python refuses to close an `mmap` while a buffer export is alive, so a slice taken
//! here stays valid for as long as the `PyBuffer` it came from, even with the GIL released.

use pyo3::buffer::{Element, PyBuffer, PyUntypedBuffer};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The memory a buffer covers, to refuse an output that overlaps another argument: a
/// function here writes its outputs while it reads its inputs, and overlapping them would
/// let it read what it has just written (and is undefined behaviour in Rust).
#[derive(Clone, Copy)]
pub struct Span {
    addr: usize,
    len: usize,
}

impl Span {
    fn of(ptr: *const u8, len: usize) -> Self {
        Span {
            addr: ptr as usize,
            len,
        }
    }

    fn overlaps(&self, other: &Span) -> bool {
        self.len > 0
            && other.len > 0
            && self.addr < other.addr.saturating_add(other.len)
            && other.addr < self.addr.saturating_add(self.len)
    }
}

/// `ValueError` if any of `outputs` overlaps another output or any of `inputs`.
pub fn disjoint(outputs: &[(&str, Span)], inputs: &[(&str, Span)]) -> PyResult<()> {
    for (i, (name, span)) in outputs.iter().enumerate() {
        for (other, o) in outputs[i + 1..].iter().chain(inputs) {
            if span.overlaps(o) {
                return Err(PyValueError::new_err(format!(
                    "{name} overlaps {other}: an output buffer must not share memory with \
                     another argument"
                )));
            }
        }
    }
    Ok(())
}

/// A read-only, C-contiguous column of `T`.
pub struct Col<T: Element> {
    buf: PyBuffer<T>,
}

impl<T: Element> Col<T> {
    pub fn new(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Self> {
        let buf = PyBuffer::<T>::get(obj).map_err(|e| {
            PyValueError::new_err(format!("{what}: not a buffer of the expected type: {e}"))
        })?;
        if !buf.is_c_contiguous() {
            return Err(PyValueError::new_err(format!(
                "{what}: buffer is not contiguous"
            )));
        }
        Ok(Col { buf })
    }

    pub fn span(&self) -> Span {
        Span::of(self.buf.buf_ptr() as *const u8, self.buf.len_bytes())
    }

    pub fn get(&self) -> &[T] {
        match self.buf.as_slice_ptr() {
            // SAFETY: the buffer is C-contiguous (checked in `new`), typed and aligned for `T`
            // (checked by `PyBuffer::get`), and lives as long as `self`. Python code could
            // still write to it while we read; the callers' contracts forbid that (the store's
            // single writer owns every buffer it hands in), and a torn read of plain integers
            // or bytes cannot break memory safety.
            Some(ptr) => unsafe { ptr.as_ref() },
            None => &[],
        }
    }
}

/// A read-only, C-contiguous run of bytes of any one-byte format (`B`, `b`, `c`): Arrow
/// buffers export themselves as signed bytes, numpy masks as unsigned.
pub struct Bytes {
    buf: PyUntypedBuffer,
}

impl Bytes {
    pub fn new(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Self> {
        let buf = PyUntypedBuffer::get(obj)
            .map_err(|e| PyValueError::new_err(format!("{what}: not a buffer: {e}")))?;
        if buf.item_size() != 1 || !buf.is_c_contiguous() {
            return Err(PyValueError::new_err(format!(
                "{what}: expected a contiguous buffer of bytes"
            )));
        }
        Ok(Bytes { buf })
    }

    pub fn span(&self) -> Span {
        Span::of(self.buf.buf_ptr() as *const u8, self.buf.len_bytes())
    }

    pub fn get(&self) -> &[u8] {
        let len = self.buf.len_bytes();
        if len == 0 {
            return &[];
        }
        // SAFETY: the buffer is C-contiguous with one-byte items (checked in `new`), so
        // `len_bytes` bytes from `buf_ptr` are its contents, alive as long as `self`. The same
        // aliasing contract as `Col::get` applies.
        unsafe { std::slice::from_raw_parts(self.buf.buf_ptr() as *const u8, len) }
    }
}

/// A writable, C-contiguous byte buffer (a segment's mapping, a preallocated numpy array).
pub struct OutBytes {
    buf: PyBuffer<u8>,
}

impl OutBytes {
    pub fn new(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Self> {
        let buf = PyBuffer::<u8>::get(obj)
            .map_err(|e| PyValueError::new_err(format!("{what}: not a byte buffer: {e}")))?;
        if buf.readonly() {
            return Err(PyValueError::new_err(format!(
                "{what}: buffer is read-only"
            )));
        }
        if !buf.is_c_contiguous() {
            return Err(PyValueError::new_err(format!(
                "{what}: buffer is not contiguous"
            )));
        }
        Ok(OutBytes { buf })
    }

    pub fn span(&self) -> Span {
        Span::of(self.buf.buf_ptr() as *const u8, self.buf.len_bytes())
    }

    pub fn len(&self) -> usize {
        self.buf.len_bytes()
    }

    /// The bytes, mutably. Every caller checks first, with [`disjoint`], that no other
    /// argument of the call shares this memory.
    pub fn get(&mut self) -> &mut [u8] {
        match self.buf.as_slice_ptr() {
            // SAFETY: writable (checked in `new`), contiguous, and alive as long as `self`;
            // `&mut self` hands out one mutable slice at a time, and `disjoint` has ruled out
            // the other arguments of the call. Python code could still write to it meanwhile;
            // the store's single writer owns the buffers it hands in.
            Some(mut ptr) => unsafe { ptr.as_mut() },
            None => &mut [],
        }
    }
}

/// A writable, C-contiguous column of `T` (results the caller preallocated with numpy).
pub struct OutCol<T: Element> {
    buf: PyBuffer<T>,
}

impl<T: Element> OutCol<T> {
    pub fn new(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Self> {
        let buf = PyBuffer::<T>::get(obj).map_err(|e| {
            PyValueError::new_err(format!("{what}: not a buffer of the expected type: {e}"))
        })?;
        if buf.readonly() || !buf.is_c_contiguous() {
            return Err(PyValueError::new_err(format!(
                "{what}: buffer must be writable and contiguous"
            )));
        }
        Ok(OutCol { buf })
    }

    pub fn span(&self) -> Span {
        Span::of(self.buf.buf_ptr() as *const u8, self.buf.len_bytes())
    }

    pub fn get(&mut self) -> &mut [T] {
        match self.buf.as_slice_ptr() {
            // SAFETY: as for `OutBytes::get`.
            Some(mut ptr) => unsafe { ptr.as_mut() },
            None => &mut [],
        }
    }
}

/// A column of strings or binaries in Arrow's layout: one data buffer, `n + 1` offsets into
/// it (int32 as Arrow's `string`/`binary` keep them, or int64 as the `large_` types do, borrowed
/// as they are), and an optional validity mask (one byte per row, non-zero = present). A column
/// with no value at all crosses as its row count in place of the offsets.
pub struct Strings {
    data: Bytes,
    offsets: OffsetCol,
    valid: Option<Bytes>,
}

enum OffsetCol {
    Narrow(Col<i32>),
    Wide(Col<i64>),
    AllNull(usize),
}

impl Strings {
    pub fn new(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Self> {
        let (data, offsets, valid): (Bound<'_, PyAny>, Bound<'_, PyAny>, Bound<'_, PyAny>) =
            obj.extract()?;
        let offsets = if let Ok(rows) = offsets.extract::<usize>() {
            OffsetCol::AllNull(rows)
        } else if let Ok(wide) = Col::<i64>::new(&offsets, what) {
            OffsetCol::Wide(wide)
        } else {
            OffsetCol::Narrow(Col::new(&offsets, what)?)
        };
        let s = Strings {
            data: Bytes::new(&data, what)?,
            offsets,
            valid: if valid.is_none() {
                None
            } else {
                Some(Bytes::new(&valid, what)?)
            },
        };
        s.check(what)?;
        Ok(s)
    }

    fn check(&self, what: &str) -> PyResult<()> {
        let len = self.data.get().len() as i64;
        let sane = match self.view().offsets {
            Offsets::Narrow(o) => ascending_within(o.iter().map(|&x| x as i64), len),
            Offsets::Wide(o) => ascending_within(o.iter().copied(), len),
            Offsets::AllNull(_) => Some(true),
        };
        match sane {
            None => return Err(PyValueError::new_err(format!("{what}: offsets are empty"))),
            Some(false) => {
                return Err(PyValueError::new_err(format!(
                    "{what}: offsets are not ascending inside the data"
                )))
            }
            Some(true) => {}
        }
        let rows = self.view().len();
        if let Some(v) = &self.valid {
            if v.get().len() != rows {
                return Err(PyValueError::new_err(format!(
                    "{what}: validity has {} rows, offsets {rows}",
                    v.get().len(),
                )));
            }
        }
        Ok(())
    }

    /// The memory of its buffers, named after the column.
    pub fn spans<'n>(&self, what: &'n str) -> Vec<(&'n str, Span)> {
        let mut out = vec![(what, self.data.span())];
        match &self.offsets {
            OffsetCol::Narrow(c) => out.push((what, c.span())),
            OffsetCol::Wide(c) => out.push((what, c.span())),
            OffsetCol::AllNull(_) => {}
        }
        if let Some(v) = &self.valid {
            out.push((what, v.span()));
        }
        out
    }

    /// Check again that the offsets are ascending and inside the data: Python code may have
    /// changed a borrowed column since it was checked.
    pub fn recheck(&self, what: &str) -> PyResult<()> {
        self.check(what)
    }

    pub fn view(&self) -> StrView<'_> {
        StrView {
            data: self.data.get(),
            offsets: match &self.offsets {
                OffsetCol::Narrow(c) => Offsets::Narrow(c.get()),
                OffsetCol::Wide(c) => Offsets::Wide(c.get()),
                OffsetCol::AllNull(n) => Offsets::AllNull(*n),
            },
            valid: self.valid.as_ref().map(|v| v.get()),
        }
    }
}

/// Whether offsets start at 0 or later, never fall and end inside `len` bytes (`None`: there
/// is not even the first offset).
fn ascending_within(mut offs: impl Iterator<Item = i64>, len: i64) -> Option<bool> {
    let first = offs.next()?;
    let mut prev = first;
    for x in offs {
        if x < prev {
            return Some(false);
        }
        prev = x;
    }
    Some(first >= 0 && prev <= len)
}

#[derive(Clone, Copy)]
enum Offsets<'a> {
    Narrow(&'a [i32]),
    Wide(&'a [i64]),
    AllNull(usize),
}

/// Borrowed form of [`Strings`], `Send` so loops can run with the GIL released.
#[derive(Clone, Copy)]
pub struct StrView<'a> {
    data: &'a [u8],
    offsets: Offsets<'a>,
    valid: Option<&'a [u8]>,
}

impl<'a> StrView<'a> {
    pub fn len(&self) -> usize {
        match self.offsets {
            Offsets::Narrow(o) => o.len() - 1,
            Offsets::Wide(o) => o.len() - 1,
            Offsets::AllNull(n) => n,
        }
    }

    /// Row `i`, or `None` when it is null.
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        if let Some(v) = self.valid {
            if v[i] == 0 {
                return None;
            }
        }
        let (lo, hi) = match self.offsets {
            Offsets::Narrow(o) => (o[i] as usize, o[i + 1] as usize),
            Offsets::Wide(o) => (o[i] as usize, o[i + 1] as usize),
            Offsets::AllNull(n) => {
                assert!(i < n, "row {i} of {n}");
                return None;
            }
        };
        Some(&self.data[lo..hi])
    }
}

/// Appends native-endian values to a byte vector that becomes a numpy array in Python.
pub fn push_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_ne_bytes());
}

pub fn push_i32(out: &mut Vec<u8>, v: i32) {
    out.extend_from_slice(&v.to_ne_bytes());
}

pub fn require_len(what: &str, got: usize, want: usize) -> PyResult<()> {
    if got != want {
        return Err(PyValueError::new_err(format!(
            "{what}: {got} rows, expected {want}"
        )));
    }
    Ok(())
}
