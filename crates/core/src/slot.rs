//! Redis Cluster slots: which slot a key hashes to, and a short hash tag for every slot.
//!
//! Cluster hashes a key by CRC16 (XMODEM) modulo 16384, over its hash tag (`{...}`) when it has
//! one. Every key a script touches must hash to one slot, so the per-slot fencing counter of a
//! lock needs a tag that hashes to the lock's own slot: [`tag_of_slot`] gives the smallest
//! decimal number that does.

use std::sync::LazyLock;

/// The number of Redis Cluster slots.
pub const SLOTS: u16 = 16384;

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), as Redis Cluster uses: a byte at a time
/// through a table built at compile time (every lock handle hashes its name, and the tag table
/// below hashes 200,000 numbers once).
fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &byte| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ byte)]
    })
}

const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// The slot of a hash tag's content (or of a whole key without a tag).
pub fn slot_of(tag: &[u8]) -> u16 {
    crc16(tag) % SLOTS
}

/// The slot Redis Cluster assigns to `key`, following its hash-tag rule: the bytes between the
/// first `{` and the first `}` after it, when at least one byte is between them.
pub fn key_slot(key: &[u8]) -> u16 {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return slot_of(&key[open + 1..open + 1 + len]);
            }
        }
    }
    slot_of(key)
}

/// For each slot, the smallest number whose decimal text hashes to it (computed once, about
/// 200,000 CRCs: a millisecond or two).
static TAGS: LazyLock<Box<[u32]>> = LazyLock::new(|| {
    let mut tags = vec![u32::MAX; usize::from(SLOTS)].into_boxed_slice();
    let mut missing = usize::from(SLOTS);
    let mut n: u32 = 0;
    let mut text = itoa_buf::Buf::default();
    while missing > 0 {
        let slot = usize::from(slot_of(text.format(n)));
        if tags[slot] == u32::MAX {
            tags[slot] = n;
            missing -= 1;
        }
        n += 1;
    }
    tags
});

/// A short hash tag (decimal digits) that hashes to `slot`.
pub fn tag_of_slot(slot: u16) -> u32 {
    TAGS[usize::from(slot % SLOTS)]
}

/// [`tag_of_slot`] as text, written into `buf` (no allocation, no `fmt` machinery: every lock
/// handle needs it).
pub(crate) fn tag_text(slot: u16, buf: &mut [u8; 10]) -> &str {
    let mut digits = itoa_buf::Buf::default();
    let text = digits.format(tag_of_slot(slot));
    buf[..text.len()].copy_from_slice(text);
    std::str::from_utf8(&buf[..text.len()]).expect("digits")
}

/// Decimal formatting without allocating.
mod itoa_buf {
    #[derive(Default)]
    pub(super) struct Buf([u8; 10]);

    impl Buf {
        pub(super) fn format(&mut self, mut n: u32) -> &[u8] {
            let mut at = self.0.len();
            loop {
                at -= 1;
                self.0[at] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 {
                    return &self.0[at..];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_slots() {
        // Values from Redis's CLUSTER KEYSLOT.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), slot_of(b"{bar"));
        assert_eq!(key_slot(b"123456789"), 0x31C3 % SLOTS);
    }

    #[test]
    fn every_slot_has_a_tag_that_hashes_to_it() {
        for slot in 0..SLOTS {
            let tag = tag_of_slot(slot).to_string();
            assert_eq!(slot_of(tag.as_bytes()), slot, "tag {tag}");
        }
        assert!(TAGS.iter().all(|&n| n < 1_000_000), "tags stay short");
    }
}
