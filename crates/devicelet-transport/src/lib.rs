//! devicelet-transport (skeleton; filled in by its owner).
