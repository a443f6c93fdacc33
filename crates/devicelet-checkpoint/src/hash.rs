//! Checksums used by the kubelet's checkpoint files and by devicelet's journal.
//!
//! * FNV-1a 32-bit (`hash/fnv` `New32a`), fed with go-spew text — device manager and CPU manager
//!   checkpoints (`pkg/kubelet/checkpointmanager/checksum/checksum.go`).
//! * CRC-32/IEEE (`hash/crc32.ChecksumIEEE`, reflected polynomial 0xEDB88320) — the DRA
//!   `dra_manager_state` envelope (`pkg/kubelet/cm/dra/state/checkpoint.go`) and our journal records.

use std::fmt;

/// Streaming FNV-1a 32-bit hasher. Implements [`fmt::Write`] so spew text can be hashed without
/// materialising it.
#[derive(Debug, Clone, Copy)]
pub struct Fnv1a32 {
    state: u32,
}

impl Fnv1a32 {
    const OFFSET_BASIS: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;

    /// A fresh hasher.
    pub fn new() -> Self {
        Self {
            state: Self::OFFSET_BASIS,
        }
    }

    /// Feeds bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        let mut h = self.state;
        for b in bytes {
            h ^= u32::from(*b);
            h = h.wrapping_mul(Self::PRIME);
        }
        self.state = h;
    }

    /// The hash of everything fed so far.
    pub fn finish(&self) -> u32 {
        self.state
    }
}

impl Default for Fnv1a32 {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Write for Fnv1a32 {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.update(s.as_bytes());
        Ok(())
    }
}

/// FNV-1a 32 of a byte string.
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut h = Fnv1a32::new();
    h.update(bytes);
    h.finish()
}

const fn crc32_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
}

static CRC32_TABLE: [u32; 256] = crc32_table();

/// Streaming CRC-32/IEEE.
#[derive(Debug, Clone, Copy)]
pub struct Crc32 {
    state: u32,
}

impl Crc32 {
    /// A fresh CRC.
    pub fn new() -> Self {
        Self { state: !0 }
    }

    /// Feeds bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        let mut c = self.state;
        for b in bytes {
            c = CRC32_TABLE[((c ^ u32::from(*b)) & 0xff) as usize] ^ (c >> 8);
        }
        self.state = c;
    }

    /// The CRC of everything fed so far.
    pub fn finish(&self) -> u32 {
        !self.state
    }
}

impl Default for Crc32 {
    fn default() -> Self {
        Self::new()
    }
}

/// CRC-32/IEEE of a byte string (Go `crc32.ChecksumIEEE`).
pub fn crc32_ieee(bytes: &[u8]) -> u32 {
    let mut c = Crc32::new();
    c.update(bytes);
    c.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a32_matches_published_check_values() {
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn crc32_matches_the_ieee_check_value() {
        assert_eq!(crc32_ieee(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32_ieee(b""), 0);
    }
}
