//! The `device` variable, resolved lazily.
//!
//! Go (`DeviceMatches` in `DRA/cel/compile.go`) builds the whole `device` map for every
//! evaluation. We keep Go's observable behaviour and skip the maps: the compiler rewrites
//! `device.driver`, `device.attributes[D].id`, `has(device.attributes[D].id)`,
//! `device.capacity[D].id`, ... into reserved identifiers that [`DeviceResolver`] answers
//! straight from the slice's maps. Only the shapes that need a real map (iterating over
//! domains, computed domain keys, `cel.bind` of a domain) build one, and only that one.
//!
//! Kept from Go: every attribute is checked before evaluation ([`validate_attributes`]),
//! so a device with an unsupported or unparseable attribute fails any selector
//! (spec §7 item 40); unqualified names belong to the driver's domain; an unknown domain
//! is an empty map; an unknown id is "no such key".

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
use kube_cel::cel::Value;
use kube_cel::cel::context::VariableResolver;
use kube_cel::cel::objects::{Key, Map};

use crate::env::Env;
use crate::error::CelEvalError;
use crate::program::{Program, RESERVED_PREFIX, Slot};

/// The device a selector is evaluated against: borrowed parts of a
/// `resource.k8s.io/v1` `Device` and its slice's driver.
#[derive(Debug, Clone, Copy)]
pub struct DeviceView<'a> {
    /// The driver of the ResourceSlice; the domain of unqualified attribute names.
    pub driver: &'a str,
    /// `device.attributes` (qualified or unqualified names).
    pub attributes: Option<&'a BTreeMap<String, DeviceAttribute>>,
    /// `device.capacity` (qualified or unqualified names).
    pub capacity: Option<&'a BTreeMap<String, DeviceCapacity>>,
    /// `device.allowMultipleAllocations`; unset reads as false.
    pub allow_multiple_allocations: Option<bool>,
}

/// Go's `parseQualifiedName`: split at the first `/`, else the driver's domain.
pub(crate) fn split_qualified<'n>(name: &'n str, driver: &'n str) -> (&'n str, &'n str) {
    match name.split_once('/') {
        Some((domain, id)) => (domain, id),
        None => (driver, name),
    }
}

/// Checks every attribute the way Go's conversion does, in name order (Go's order is map
/// order, i.e. random, when several are bad).
pub(crate) fn validate_attributes(
    device: &DeviceView<'_>,
    env: &Env,
    list_types: bool,
) -> Result<(), CelEvalError> {
    let Some(attributes) = device.attributes else {
        return Ok(());
    };
    for (name, attr) in attributes {
        let fail = |reason: String| CelEvalError::Attribute {
            name: name.clone(),
            reason,
        };
        if attr.int.is_some() || attr.bool.is_some() || attr.string.is_some() {
            continue;
        }
        if let Some(v) = &attr.version {
            env.check_version(v)
                .map_err(|e| fail(format!("parse semantic version: {e}")))?;
            continue;
        }
        if list_types {
            if attr.ints.is_some() || attr.bools.is_some() || attr.strings.is_some() {
                continue;
            }
            if let Some(vs) = &attr.versions {
                for v in vs {
                    env.check_version(v)
                        .map_err(|e| fail(format!("parse semantic version: {e}")))?;
                }
                continue;
            }
        }
        return Err(fail("unsupported attribute value".to_string()));
    }
    Ok(())
}

/// Converts one (validated) attribute to its CEL value.
fn attribute_value(attr: &DeviceAttribute, env: &Env, list_types: bool) -> Option<Value> {
    if let Some(i) = attr.int {
        return Some(Value::Int(i));
    }
    if let Some(b) = attr.bool {
        return Some(Value::Bool(b));
    }
    if let Some(s) = &attr.string {
        return Some(Value::String(Arc::new(s.clone())));
    }
    if let Some(v) = &attr.version {
        return env.version(v).ok();
    }
    if !list_types {
        return None;
    }
    if let Some(xs) = &attr.ints {
        return Some(Value::List(Arc::new(
            xs.iter().map(|x| Value::Int(*x)).collect(),
        )));
    }
    if let Some(xs) = &attr.bools {
        return Some(Value::List(Arc::new(
            xs.iter().map(|x| Value::Bool(*x)).collect(),
        )));
    }
    if let Some(xs) = &attr.strings {
        return Some(Value::List(Arc::new(
            xs.iter()
                .map(|x| Value::String(Arc::new(x.clone())))
                .collect(),
        )));
    }
    if let Some(xs) = &attr.versions {
        let values: Option<Vec<Value>> = xs.iter().map(|x| env.version(x).ok()).collect();
        return values.map(|v| Value::List(Arc::new(v)));
    }
    None
}

fn map_value(entries: HashMap<Key, Value>) -> Value {
    Value::Map(Map {
        map: Arc::new(entries),
    })
}

fn key(s: &str) -> Key {
    Key::String(Arc::new(s.to_string()))
}

/// Answers the reserved identifiers of a compiled selector for one device.
pub(crate) struct DeviceResolver<'a> {
    pub(crate) device: &'a DeviceView<'a>,
    pub(crate) program: &'a Program,
    pub(crate) env: &'a Env,
    pub(crate) list_types: bool,
    pub(crate) consumable_capacity: bool,
}

impl DeviceResolver<'_> {
    fn find_attribute(&self, slot: &Slot) -> Option<&DeviceAttribute> {
        let attributes = self.device.attributes?;
        if slot.domain == self.device.driver
            && let Some(a) = attributes.get(slot.id.as_str())
        {
            return Some(a);
        }
        attributes.get(slot.qualified.as_str())
    }

    fn find_capacity(&self, slot: &Slot) -> Option<&DeviceCapacity> {
        let capacity = self.device.capacity?;
        if slot.domain == self.device.driver
            && let Some(c) = capacity.get(slot.id.as_str())
        {
            return Some(c);
        }
        capacity.get(slot.qualified.as_str())
    }

    /// The attributes of one domain as a map (empty for an unknown domain).
    fn attribute_domain(&self, domain: &str) -> Value {
        let mut entries = HashMap::new();
        if let Some(attributes) = self.device.attributes {
            for (name, attr) in attributes {
                let (d, id) = split_qualified(name, self.device.driver);
                if d == domain
                    && let Some(v) = attribute_value(attr, self.env, self.list_types)
                {
                    entries.insert(key(id), v);
                }
            }
        }
        map_value(entries)
    }

    fn capacity_domain(&self, domain: &str) -> Value {
        let mut entries = HashMap::new();
        if let Some(capacity) = self.device.capacity {
            for (name, cap) in capacity {
                let (d, id) = split_qualified(name, self.device.driver);
                if d == domain
                    && let Ok(v) = self.env.quantity(&cap.value.0)
                {
                    entries.insert(key(id), v);
                }
            }
        }
        map_value(entries)
    }

    fn all_attributes(&self) -> Value {
        let mut domains: HashMap<&str, HashMap<Key, Value>> = HashMap::new();
        if let Some(attributes) = self.device.attributes {
            for (name, attr) in attributes {
                let (d, id) = split_qualified(name, self.device.driver);
                if let Some(v) = attribute_value(attr, self.env, self.list_types) {
                    domains.entry(d).or_default().insert(key(id), v);
                }
            }
        }
        map_value(
            domains
                .into_iter()
                .map(|(d, m)| (key(d), map_value(m)))
                .collect(),
        )
    }

    fn all_capacity(&self) -> Value {
        let mut domains: HashMap<&str, HashMap<Key, Value>> = HashMap::new();
        if let Some(capacity) = self.device.capacity {
            for (name, cap) in capacity {
                let (d, id) = split_qualified(name, self.device.driver);
                if let Ok(v) = self.env.quantity(&cap.value.0) {
                    domains.entry(d).or_default().insert(key(id), v);
                }
            }
        }
        map_value(
            domains
                .into_iter()
                .map(|(d, m)| (key(d), map_value(m)))
                .collect(),
        )
    }

    fn whole_device(&self) -> Value {
        let mut fields = HashMap::new();
        fields.insert(
            key("driver"),
            Value::String(Arc::new(self.device.driver.to_string())),
        );
        fields.insert(key("attributes"), self.all_attributes());
        fields.insert(key("capacity"), self.all_capacity());
        if self.consumable_capacity {
            fields.insert(
                key("allowMultipleAllocations"),
                Value::Bool(self.device.allow_multiple_allocations.unwrap_or(false)),
            );
        }
        map_value(fields)
    }
}

impl VariableResolver for DeviceResolver<'_> {
    fn resolve(&self, name: &str) -> Option<Value> {
        let rest = name.strip_prefix(RESERVED_PREFIX)?;
        let tag = rest.as_bytes().first()?;
        let index = || rest.get(1..).and_then(|s| s.parse::<usize>().ok());
        match tag {
            b'D' => Some(Value::String(Arc::new(self.device.driver.to_string()))),
            b'M' => Some(Value::Bool(
                self.device.allow_multiple_allocations.unwrap_or(false),
            )),
            b'A' => {
                let slot = self.program.attribute_slots.get(index()?)?;
                attribute_value(self.find_attribute(slot)?, self.env, self.list_types)
            }
            b'H' => {
                let slot = self.program.attribute_slots.get(index()?)?;
                Some(Value::Bool(self.find_attribute(slot).is_some()))
            }
            b'C' => {
                let slot = self.program.capacity_slots.get(index()?)?;
                self.env.quantity(&self.find_capacity(slot)?.value.0).ok()
            }
            b'J' => {
                let slot = self.program.capacity_slots.get(index()?)?;
                Some(Value::Bool(self.find_capacity(slot).is_some()))
            }
            b'P' => Some(self.attribute_domain(self.program.attribute_domains.get(index()?)?)),
            b'Q' => Some(self.capacity_domain(self.program.capacity_domains.get(index()?)?)),
            b'X' => Some(self.all_attributes()),
            b'Y' => Some(self.all_capacity()),
            b'V' => Some(self.whole_device()),
            b'K' => self.program.constants.get(index()?).cloned(),
            _ => None,
        }
    }
}
