//! Java's `String.hashCode`, RocketMQ's two uses of it, the body CRC, and the PROPERTIES
//! field's grammar as RocketMQ 4.9.x reads it.

/// `String.hashCode()` of UTF-8 `bytes`: `h = 31 * h + unit` over the UTF-16 code units, in
/// wrapping 32-bit arithmetic, continuing from `h`.
pub fn java_hash_from(mut h: i32, bytes: &[u8]) -> i32 {
    if bytes.is_ascii() {
        for &b in bytes {
            h = h.wrapping_mul(31).wrapping_add(b as i32);
        }
        return h;
    }
    // Java decodes malformed UTF-8 to U+FFFD as well; stores we write hold valid UTF-8 only.
    for unit in String::from_utf8_lossy(bytes).encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(unit as i32);
    }
    h
}

pub fn java_hash(bytes: &[u8]) -> i32 {
    java_hash_from(0, bytes)
}

/// IndexFile key hash of `topic#key`: `abs(hashCode)`, with `Integer.MIN_VALUE` mapped to 0.
pub fn index_key_hash(topic: &[u8], key: &[u8]) -> i32 {
    let h = java_hash_from(java_hash_from(java_hash(topic), b"#"), key);
    if h == i32::MIN {
        0
    } else {
        h.abs()
    }
}

/// BODYCRC as RocketMQ stores it: the CRC-32 masked to 31 bits.
pub fn body_crc(body: &[u8]) -> i32 {
    (crc32fast::hash(body) & 0x7FFF_FFFF) as i32
}

/// The name/value pairs of a PROPERTIES field, as RocketMQ's `string2messageProperties`
/// reads it: items split on `\x02`, each split on `\x01` with trailing empty parts dropped
/// (Java's `String.split`), and only items of exactly two parts kept. So an empty value or an
/// item without a separator is skipped, and a later duplicate name wins when collected.
pub fn properties(raw: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    raw.split(|&b| b == 2).filter_map(|item| {
        // Dropping trailing empty parts is dropping trailing separators; what is left has
        // exactly two parts when it holds exactly one separator.
        let end = item.iter().rposition(|&b| b != 1).map_or(0, |p| p + 1);
        let item = &item[..end];
        let sep = item.iter().position(|&b| b == 1)?;
        let (name, value) = (&item[..sep], &item[sep + 1..]);
        (!value.contains(&1)).then_some((name, value))
    })
}

/// The KEYS, TAGS and UNIQ_KEY values of a PROPERTIES field (the last of each name wins).
#[derive(Default, Clone, Copy)]
pub struct Reserved<'a> {
    pub keys: Option<&'a [u8]>,
    pub tags: Option<&'a [u8]>,
    pub uniq: Option<&'a [u8]>,
}

pub fn reserved(raw: &[u8]) -> Reserved<'_> {
    let mut r = Reserved::default();
    for (name, value) in properties(raw) {
        match name {
            b"KEYS" => r.keys = Some(value),
            b"TAGS" => r.tags = Some(value),
            b"UNIQ_KEY" => r.uniq = Some(value),
            _ => {}
        }
    }
    r
}

/// ConsumeQueue tagsCode: the tag's hash widened to a long, 0 without a tag.
pub fn tags_code(tags: Option<&[u8]>) -> i64 {
    match tags {
        Some(t) if !t.is_empty() => java_hash(t) as i64,
        _ => 0,
    }
}

/// Calls `f` with the key hash of each index entry RocketMQ's `buildIndex` makes for a
/// message: the UNIQ_KEY, then every non-empty space-separated KEYS token.
pub fn for_each_index_key(
    topic: &[u8],
    uniq: Option<&[u8]>,
    keys: Option<&[u8]>,
    mut f: impl FnMut(i32),
) {
    if let Some(u) = uniq {
        f(index_key_hash(topic, u));
    }
    if let Some(k) = keys {
        for token in k.split(|&b| b == b' ').filter(|t| !t.is_empty()) {
            f(index_key_hash(topic, token));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_java_hashes() {
        // Values from Java itself: "Aa".hashCode() == "BB".hashCode() == 2112,
        // "hello".hashCode() == 99162322, "".hashCode() == 0.
        assert_eq!(java_hash(b"Aa"), 2112);
        assert_eq!(java_hash(b"BB"), 2112);
        assert_eq!(java_hash(b"hello"), 99162322);
        assert_eq!(java_hash(b""), 0);
        // U+1F600 is the surrogate pair D83D DE00: 31 * 0xD83D + 0xDE00.
        assert_eq!(java_hash("\u{1F600}".as_bytes()), 31 * 0xD83D + 0xDE00);
    }

    #[test]
    fn properties_follow_java_split() {
        let got: Vec<_> =
            properties(b"a\x01b\x02c\x01\x02d\x02\x01e\x02f\x01g\x01h\x02i\x01j\x01").collect();
        let want: Vec<(&[u8], &[u8])> = vec![(b"a", b"b"), (b"", b"e"), (b"i", b"j")];
        assert_eq!(got, want);
    }

    #[test]
    fn index_keys_in_rocketmq_order() {
        let mut got = vec![];
        for_each_index_key(b"T", Some(b"U"), Some(b" k1  k2 "), |h| got.push(h));
        assert_eq!(
            got,
            vec![
                index_key_hash(b"T", b"U"),
                index_key_hash(b"T", b"k1"),
                index_key_hash(b"T", b"k2")
            ]
        );
        assert_eq!(index_key_hash(b"T", b"U"), java_hash(b"T#U").abs());
    }
}
