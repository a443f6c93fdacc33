//! devicelet-rpc (skeleton; filled in by its owner).
