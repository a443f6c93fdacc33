//! [`CachedResponse`]: a plugin's `Allocate` answer for one container as the Device Manager keeps
//! it (the kubelet's `podDevices` `allocResp`, `pkg/kubelet/cm/devicemanager/pod_devices.go`):
//! decoded when it was just allocated, or still the checkpoint's `AllocResp` bytes after a
//! restart, decoded on first use. A restart with 10 000 containers is then ready without decoding
//! 10 000 answers; a container's answer is decoded when `start` (or anything else) first asks.

use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::types::ContainerAllocateResponse;

/// Decodes stored `AllocResp` bytes; `None` when they do not decode.
pub type ResponseDecoder = Arc<dyn Fn(&[u8]) -> Option<ContainerAllocateResponse> + Send + Sync>;

/// An `Allocate` answer, lost, decoded, or encoded and decoded on first use.
#[derive(Clone, Default)]
pub struct CachedResponse(Repr);

#[derive(Clone, Default)]
enum Repr {
    /// No answer (lost with the checkpoint, or not yet asked for).
    #[default]
    Lost,
    /// Decoded.
    Decoded(ContainerAllocateResponse),
    /// The stored bytes; shared by clones, so the decoding happens once.
    Encoded(Arc<Encoded>),
}

struct Encoded {
    bytes: Vec<u8>,
    decoder: ResponseDecoder,
    decoded: OnceLock<Option<ContainerAllocateResponse>>,
}

impl CachedResponse {
    /// No answer.
    pub fn lost() -> Self {
        Self(Repr::Lost)
    }

    /// The stored bytes, decoded by `decoder` when first asked for.
    pub fn encoded(bytes: Vec<u8>, decoder: ResponseDecoder) -> Self {
        Self(Repr::Encoded(Arc::new(Encoded {
            bytes,
            decoder,
            decoded: OnceLock::new(),
        })))
    }

    /// The answer; `None` when there is none or its bytes do not decode.
    pub fn get(&self) -> Option<&ContainerAllocateResponse> {
        match &self.0 {
            Repr::Lost => None,
            Repr::Decoded(r) => Some(r),
            Repr::Encoded(e) => e.decoded.get_or_init(|| (e.decoder)(&e.bytes)).as_ref(),
        }
    }

    /// Whether there is a usable answer (decodes stored bytes if not done yet).
    pub fn is_some(&self) -> bool {
        self.get().is_some()
    }

    /// Whether there is no usable answer (decodes stored bytes if not done yet).
    pub fn is_none(&self) -> bool {
        !self.is_some()
    }

    /// The stored bytes when the answer came from a checkpoint (what a new checkpoint can hold
    /// again without encoding).
    pub fn encoded_bytes(&self) -> Option<&[u8]> {
        match &self.0 {
            Repr::Encoded(e) => Some(&e.bytes),
            _ => None,
        }
    }
}

impl From<ContainerAllocateResponse> for CachedResponse {
    fn from(response: ContainerAllocateResponse) -> Self {
        Self(Repr::Decoded(response))
    }
}

impl From<Option<ContainerAllocateResponse>> for CachedResponse {
    fn from(response: Option<ContainerAllocateResponse>) -> Self {
        response.map_or_else(Self::lost, Self::from)
    }
}

impl PartialEq for CachedResponse {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for CachedResponse {}

impl fmt::Debug for CachedResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Lost => f.write_str("Lost"),
            Repr::Decoded(r) => f.debug_tuple("Decoded").field(r).finish(),
            Repr::Encoded(e) => match e.decoded.get() {
                Some(r) => f.debug_tuple("Decoded").field(r).finish(),
                None => write!(f, "Encoded({} bytes)", e.bytes.len()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn stored_bytes_are_decoded_once_on_first_use_and_shared_by_clones() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let decoder: ResponseDecoder = Arc::new(move |b: &[u8]| {
            counted.fetch_add(1, Ordering::SeqCst);
            (b == b"ok").then(ContainerAllocateResponse::default)
        });
        let cached = CachedResponse::encoded(b"ok".to_vec(), Arc::clone(&decoder));
        let copy = cached.clone();
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "nothing decoded before use"
        );
        assert_eq!(format!("{cached:?}"), "Encoded(2 bytes)");
        assert!(cached.is_some());
        assert!(copy.get().is_some());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(cached.encoded_bytes(), Some(&b"ok"[..]));
        assert_eq!(
            cached,
            CachedResponse::from(ContainerAllocateResponse::default())
        );

        let bad = CachedResponse::encoded(b"bad".to_vec(), decoder);
        assert!(bad.is_none());
        assert_eq!(bad, CachedResponse::lost());
    }
}
