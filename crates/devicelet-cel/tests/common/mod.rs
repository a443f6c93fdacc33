//! Shared helpers of the integration tests: owned devices and attribute constructors.
#![allow(dead_code)]

use std::collections::BTreeMap;

use devicelet_cel::DeviceView;
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

#[derive(Default, Clone, Debug)]
pub struct TestDevice {
    pub driver: String,
    pub attributes: BTreeMap<String, DeviceAttribute>,
    pub capacity: BTreeMap<String, DeviceCapacity>,
    pub allow_multiple_allocations: Option<bool>,
}

impl TestDevice {
    pub fn new(driver: &str) -> Self {
        TestDevice {
            driver: driver.to_string(),
            ..Default::default()
        }
    }
    pub fn attr(mut self, name: &str, value: DeviceAttribute) -> Self {
        self.attributes.insert(name.to_string(), value);
        self
    }
    pub fn cap(mut self, name: &str, quantity: &str) -> Self {
        self.capacity.insert(
            name.to_string(),
            DeviceCapacity {
                value: Quantity(quantity.to_string()),
                ..Default::default()
            },
        );
        self
    }
    pub fn multi(mut self, v: Option<bool>) -> Self {
        self.allow_multiple_allocations = v;
        self
    }
    pub fn view(&self) -> DeviceView<'_> {
        DeviceView {
            driver: &self.driver,
            attributes: Some(&self.attributes),
            capacity: Some(&self.capacity),
            allow_multiple_allocations: self.allow_multiple_allocations,
        }
    }
}

pub fn int(v: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(v),
        ..Default::default()
    }
}
pub fn boolean(v: bool) -> DeviceAttribute {
    DeviceAttribute {
        bool: Some(v),
        ..Default::default()
    }
}
pub fn string(v: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(v.to_string()),
        ..Default::default()
    }
}
pub fn version(v: &str) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(v.to_string()),
        ..Default::default()
    }
}
pub fn strings(v: &[&str]) -> DeviceAttribute {
    DeviceAttribute {
        strings: Some(v.iter().map(|s| s.to_string()).collect()),
        ..Default::default()
    }
}
pub fn ints(v: &[i64]) -> DeviceAttribute {
    DeviceAttribute {
        ints: Some(v.to_vec()),
        ..Default::default()
    }
}
pub fn bools(v: &[bool]) -> DeviceAttribute {
    DeviceAttribute {
        bools: Some(v.to_vec()),
        ..Default::default()
    }
}
pub fn versions(v: &[&str]) -> DeviceAttribute {
    DeviceAttribute {
        versions: Some(v.iter().map(|s| s.to_string()).collect()),
        ..Default::default()
    }
}
