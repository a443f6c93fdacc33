//! devicelet-proto (skeleton; filled in by its owner).
