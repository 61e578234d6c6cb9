//! The RocketMQ 4.9.x CommitLog record and ConsumeQueue unit: constants, sizes and the one
//! writer both the batch and the single put use. The layout itself, with its byte diagram, is
//! documented once, in `pipeline/format/record.py`.

pub const MAGIC: i32 = -626_843_481; // 0xDAA320A7
pub const BLANK_MAGIC: i32 = -875_286_124; // 0xCBD43194
pub const FIXED_SIZE_V4: usize = 91;
pub const BORNHOST_V6_FLAG: i32 = 0x10;
pub const STOREHOST_V6_FLAG: i32 = 0x20;
pub const TRANSACTION_MASK: i32 = 0xC;
pub const TRANSACTION_COMMIT: i32 = 0x8;
pub const TRANSACTION_ROLLBACK: i32 = 0xC;

pub const BLANK_SIZE: usize = 8;

// Field offsets of the fixed part of a record.
pub const OFF_TOTALSIZE: usize = 0;
pub const OFF_MAGIC: usize = 4;
pub const OFF_BODYCRC: usize = 8;
pub const OFF_QUEUEID: usize = 12;
pub const OFF_FLAG: usize = 16;
pub const OFF_QUEUEOFFSET: usize = 20;
pub const OFF_PHYSICALOFFSET: usize = 28;
pub const OFF_SYSFLAG: usize = 36;
pub const OFF_BORNTIMESTAMP: usize = 40;
pub const OFF_BORNHOST: usize = 48;

/// The constants above, by the names `pipeline/format/record.py` gives them, for the Python side:
/// one definition of the layout for both languages.
pub const EXPORTED: [(&str, i64); 19] = [
    ("MAGIC", MAGIC as i64),
    ("BLANK_MAGIC", BLANK_MAGIC as i64),
    ("BLANK_SIZE", BLANK_SIZE as i64),
    ("FIXED_SIZE_V4", FIXED_SIZE_V4 as i64),
    ("BORNHOST_V6_FLAG", BORNHOST_V6_FLAG as i64),
    ("STOREHOSTADDRESS_V6_FLAG", STOREHOST_V6_FLAG as i64),
    ("TRANSACTION_MASK", TRANSACTION_MASK as i64),
    ("TRANSACTION_COMMIT_TYPE", TRANSACTION_COMMIT as i64),
    ("TRANSACTION_ROLLBACK_TYPE", TRANSACTION_ROLLBACK as i64),
    ("OFF_TOTALSIZE", OFF_TOTALSIZE as i64),
    ("OFF_MAGIC", OFF_MAGIC as i64),
    ("OFF_BODYCRC", OFF_BODYCRC as i64),
    ("OFF_QUEUEID", OFF_QUEUEID as i64),
    ("OFF_FLAG", OFF_FLAG as i64),
    ("OFF_QUEUEOFFSET", OFF_QUEUEOFFSET as i64),
    ("OFF_PHYSICALOFFSET", OFF_PHYSICALOFFSET as i64),
    ("OFF_SYSFLAG", OFF_SYSFLAG as i64),
    ("OFF_BORNTIMESTAMP", OFF_BORNTIMESTAMP as i64),
    ("OFF_BORNHOST", OFF_BORNHOST as i64),
];

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

/// A record's size: the fixed part with IPv4 hosts, the variable fields, and 12 more bytes
/// for each host that is IPv6 (host fields are 8 or 20 bytes).
pub fn record_size(
    body: usize,
    topic: usize,
    props: usize,
    born_host: usize,
    store_host: usize,
) -> usize {
    FIXED_SIZE_V4 + body + topic + props + born_host - 8 + store_host - 8
}

/// One record's fields, in the order they are stored (`pipeline/format/record.py` has the diagram).
pub struct Record<'a> {
    pub queue_id: i32,
    pub flag: i32,
    pub queue_offset: i64,
    pub phys: i64,
    pub sys_flag: i32,
    pub born_ts: i64,
    pub born_host: &'a [u8],
    pub store_ts: i64,
    pub store_host: &'a [u8],
    pub reconsume: i32,
    pub prep_tx: i64,
    pub body: &'a [u8],
    pub topic: &'a [u8],
    pub props_len: usize,
}

impl Record<'_> {
    /// Writes the record into `out`, exactly its [`record_size`] bytes, body CRC included:
    /// `props` writes the PROPERTIES field's `props_len` bytes, and the first 8 bytes go last
    /// (see [`seal`]).
    pub fn write(&self, out: &mut [u8], props: impl FnOnce(&mut Writer<'_>)) {
        let size = out.len();
        let mut w = Writer { buf: out, pos: 8 };
        w.i32(crate::hash::body_crc(self.body));
        w.i32(self.queue_id);
        w.i32(self.flag);
        w.i64(self.queue_offset);
        w.i64(self.phys);
        w.i32(self.sys_flag);
        w.i64(self.born_ts);
        w.bytes(self.born_host);
        w.i64(self.store_ts);
        w.bytes(self.store_host);
        w.i32(self.reconsume);
        w.i64(self.prep_tx);
        w.i32(self.body.len() as i32);
        w.bytes(self.body);
        w.bytes(&[self.topic.len() as u8]);
        w.bytes(self.topic);
        w.i16(self.props_len as i16);
        props(&mut w);
        debug_assert_eq!(w.pos, size);
        seal(w.buf, size);
    }
}

/// A ConsumeQueue unit as its file holds it: the record's offset, size and tagsCode.
pub const UNIT_SIZE: usize = 20;

pub fn unit(phys: i64, size: i32, tags_code: i64) -> [u8; UNIT_SIZE] {
    let mut out = [0u8; UNIT_SIZE];
    out[..8].copy_from_slice(&phys.to_be_bytes());
    out[8..12].copy_from_slice(&size.to_be_bytes());
    out[12..].copy_from_slice(&tags_code.to_be_bytes());
    out
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
