//! devicelet-devicemanager (skeleton; filled in by its owner).
