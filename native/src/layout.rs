//! Constants of the RocketMQ 4.9.x CommitLog record. The layout itself, with its byte
//! diagram, is documented once, in `pipeline/record.py`.

pub const MAGIC: i32 = -626_843_481; // 0xDAA320A7
pub const BLANK_MAGIC: i32 = -875_286_124; // 0xCBD43194
pub const FIXED_SIZE_V4: usize = 91;
pub const BORNHOST_V6_FLAG: i32 = 0x10;
pub const STOREHOST_V6_FLAG: i32 = 0x20;
pub const TRANSACTION_MASK: i32 = 0xC;
pub const TRANSACTION_COMMIT: i32 = 0x8;
pub const TRANSACTION_ROLLBACK: i32 = 0xC;

pub const OFF_SYSFLAG: usize = 36;
pub const OFF_BORNHOST: usize = 48;

/// Whether a record of this SYSFLAG gets a ConsumeQueue unit (not PREPARED or ROLLBACK).
pub fn in_consume_queue(sys_flag: i32) -> bool {
    matches!(sys_flag & TRANSACTION_MASK, 0 | TRANSACTION_COMMIT)
}

/// Whether a record of this SYSFLAG gets index entries (not ROLLBACK).
pub fn indexed(sys_flag: i32) -> bool {
    sys_flag & TRANSACTION_MASK != TRANSACTION_ROLLBACK
}

pub fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub fn be_i64(b: &[u8], at: usize) -> i64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(raw)
}

pub fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}

/// A cursor that writes big-endian fields into a byte slice; the caller sized the slice.
pub struct Writer<'a> {
    pub buf: &'a mut [u8],
    pub pos: usize,
}

impl Writer<'_> {
    pub fn bytes(&mut self, b: &[u8]) {
        self.buf[self.pos..self.pos + b.len()].copy_from_slice(b);
        self.pos += b.len();
    }
    pub fn i32(&mut self, v: i32) {
        self.bytes(&v.to_be_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.bytes(&v.to_be_bytes());
    }
    pub fn i16(&mut self, v: i16) {
        self.bytes(&v.to_be_bytes());
    }
}

/// Writes a record's first 8 bytes (TOTALSIZE, MAGICCODE) once the rest of it is in place.
///
/// A reader, or recovery after a kill -9, takes bytes for a record only where the magic code
/// stands; sealing last means a record cut short by a crash shows no magic code, instead of a
/// valid-looking header over zeros where its properties should be (the body CRC covers only the
/// body). The release fence keeps the compiler and the CPU from moving the seal before the
/// record's other stores.
pub fn seal(record: &mut [u8], size: usize) {
    std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
    record[..4].copy_from_slice(&(size as i32).to_be_bytes());
    record[4..8].copy_from_slice(&MAGIC.to_be_bytes());
}
