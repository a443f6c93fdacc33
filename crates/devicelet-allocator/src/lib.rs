//! devicelet-allocator (skeleton; filled in by its owner).
