//! Linux CPU list strings such as `0-3,8,10-11`, as the kubelet parses and prints them.
//!
//! Follows `k8s.io/utils/cpuset` (`Parse`, `CPUSet.String`): the empty string is the empty set;
//! elements are separated by `,`; each is `N` or `A-B` with `A <= B` (split at the first `-`);
//! numbers are parsed like Go's `strconv.Atoi` (optional `+`, decimal digits, no spaces); duplicates
//! and overlaps merge. Printing sorts and collapses runs of consecutive CPUs into `A-B`.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// Upper bound on the elements one range may add (Go has none; a typo such as `0-4294967295`
/// would otherwise allocate without bound).
pub const MAX_RANGE_LEN: u64 = 1 << 20;

/// A set of CPU IDs.
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash, PartialOrd, Ord)]
pub struct CpuSet(BTreeSet<u32>);

/// Why a CPU list string did not parse. The messages match the kubelet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuSetParseError {
    /// Not a decimal integer (`strconv.Atoi: parsing "x": invalid syntax`).
    #[error("strconv.Atoi: parsing {0:?}: invalid syntax")]
    InvalidSyntax(String),
    /// Does not fit (`strconv.Atoi: parsing "x": value out of range`).
    #[error("strconv.Atoi: parsing {0:?}: value out of range")]
    OutOfRange(String),
    /// `A-B` with `A > B`.
    #[error("invalid range {range:?} ({start} > {end})")]
    InvalidRange {
        /// The element text.
        range: String,
        /// Start.
        start: i64,
        /// End.
        end: i64,
    },
    /// A range larger than [`MAX_RANGE_LEN`].
    #[error("range {0:?} is too large")]
    TooLarge(String),
}

/// Go's `strconv.Atoi` for 64-bit `int`.
fn atoi(s: &str) -> Result<i64, CpuSetParseError> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CpuSetParseError::InvalidSyntax(s.to_string()));
    }
    s.parse::<i64>()
        .map_err(|_| CpuSetParseError::OutOfRange(s.to_string()))
}

fn cpu_id(v: i64, text: &str) -> Result<u32, CpuSetParseError> {
    u32::try_from(v).map_err(|_| CpuSetParseError::OutOfRange(text.to_string()))
}

impl CpuSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses a CPU list string.
    pub fn parse(s: &str) -> Result<Self, CpuSetParseError> {
        let mut set = BTreeSet::new();
        if s.is_empty() {
            return Ok(CpuSet(set));
        }
        for part in s.split(',') {
            match part.split_once('-') {
                None => {
                    let v = atoi(part)?;
                    set.insert(cpu_id(v, part)?);
                }
                Some((a, b)) => {
                    let start = atoi(a)?;
                    let end = atoi(b)?;
                    if start > end {
                        return Err(CpuSetParseError::InvalidRange {
                            range: part.to_string(),
                            start,
                            end,
                        });
                    }
                    if (end - start) as u64 >= MAX_RANGE_LEN {
                        return Err(CpuSetParseError::TooLarge(part.to_string()));
                    }
                    let (start, end) = (cpu_id(start, a)?, cpu_id(end, b)?);
                    set.extend(start..=end);
                }
            }
        }
        Ok(CpuSet(set))
    }

    /// The CPUs in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    /// Number of CPUs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True when `cpu` is in the set.
    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        CpuSet(iter.into_iter().collect())
    }
}

impl FromStr for CpuSet {
    type Err = CpuSetParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CpuSet::parse(s)
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut iter = self.0.iter().copied().peekable();
        let mut first = true;
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end.wrapping_add(1))) && end != u32::MAX {
                end += 1;
                iter.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_prints_like_k8s_utils_cpuset() {
        for (input, printed) in [
            ("", ""),
            ("0", "0"),
            ("0-3,8,10-11", "0-3,8,10-11"),
            ("1,2", "1-2"),
            ("3-3", "3"),
            ("5,1-3,2", "1-3,5"),
            ("+4", "4"),
            ("0--0", "0"),
            ("007", "7"),
        ] {
            assert_eq!(
                CpuSet::parse(input).map(|s| s.to_string()),
                Ok(printed.to_string()),
                "{input}"
            );
        }
    }

    #[test]
    fn rejects_what_the_kubelet_rejects_with_its_messages() {
        assert_eq!(
            CpuSet::parse("1.3").map_err(|e| e.to_string()),
            Err(r#"strconv.Atoi: parsing "1.3": invalid syntax"#.to_string())
        );
        assert_eq!(
            CpuSet::parse("asd").map_err(|e| e.to_string()),
            Err(r#"strconv.Atoi: parsing "asd": invalid syntax"#.to_string())
        );
        assert_eq!(
            CpuSet::parse("3-1").map_err(|e| e.to_string()),
            Err(r#"invalid range "3-1" (3 > 1)"#.to_string())
        );
        for bad in [" 1", "1,", ",", "-1", "1-", "a-2", "1 - 2", "1_0"] {
            assert!(CpuSet::parse(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn printing_then_parsing_returns_the_same_set(cpus in proptest::collection::btree_set(0u32..300, 0..64)) {
            let set: CpuSet = cpus.into_iter().collect();
            let text = set.to_string();
            prop_assert_eq!(CpuSet::parse(&text), Ok(set));
        }

        #[test]
        fn printed_form_is_canonical(parts in proptest::collection::vec((0u32..100, 0u32..5), 0..10)) {
            // Any list of ranges, in any order with overlaps, prints as sorted disjoint maximal runs.
            let text = parts.iter().map(|(a, n)| if *n == 0 { a.to_string() } else { format!("{a}-{}", a + n) }).collect::<Vec<_>>().join(",");
            let set = CpuSet::parse(&text).expect("valid");
            let printed = set.to_string();
            prop_assert_eq!(CpuSet::parse(&printed).expect("reparse").to_string(), printed.clone());
            let mut last: Option<u32> = None;
            for run in printed.split(',').filter(|r| !r.is_empty()) {
                let (a, b) = match run.split_once('-') {
                    Some((a, b)) => (a.parse::<u32>().expect("num"), b.parse::<u32>().expect("num")),
                    None => { let v = run.parse::<u32>().expect("num"); (v, v) }
                };
                prop_assert!(a <= b);
                if let Some(l) = last { prop_assert!(a > l + 1, "runs are maximal and sorted"); }
                last = Some(b);
            }
        }
    }
}
