//! devicelet-topology (skeleton; filled in by its owner).
