//! Exact Kubernetes quantity arithmetic, shared by the DRA allocator (capacity, counters) and
//! the CPU manager (CPU requests), following
//! `k8s.io/apimachinery/pkg/api/resource/quantity.go` (parsing, `Value()`, `Cmp`, `Add`, `Sub`
//! and the canonical string form).
//!
//! A quantity is kept as a signed count of nano-units in an `i128`, which is exact for every
//! value Kubernetes can represent at nano precision up to about 1.7e29 (far above the
//! 2^63 range that the API server accepts). Parsing rounds sub-nano precision away from zero,
//! like Go's `inf.RoundUp`. Values outside the `i128` range are rejected with
//! [`QuantityError::OutOfRange`] instead of being silently clamped.

use std::cmp::Ordering;
use std::fmt;

/// Nano-units per unit.
const NANO: i128 = 1_000_000_000;

/// How a quantity prints itself (Go: `resource.Format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantityFormat {
    /// `1k`, `500m`, `2`.
    DecimalSI,
    /// `1Ki`, `4Gi`.
    BinarySI,
    /// `1e3`.
    DecimalExponent,
}

/// Why a quantity string could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {0:?}"
    )]
    Format(String),
    #[error("unable to parse quantity's suffix: {0:?}")]
    Suffix(String),
    #[error("quantity {0:?} is out of the supported range")]
    OutOfRange(String),
}

/// An exact Kubernetes quantity.
#[derive(Clone, Copy, Debug)]
pub struct Quantity {
    nanos: i128,
    format: QuantityFormat,
}

impl PartialEq for Quantity {
    /// Semantic equality (`1Gi == 1024Mi`), like `Quantity.Cmp(...) == 0`.
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}
impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

fn pow10(exp: u32) -> Option<i128> {
    10i128.checked_pow(exp)
}

impl Quantity {
    /// Zero in decimal SI form.
    pub const ZERO: Quantity = Quantity {
        nanos: 0,
        format: QuantityFormat::DecimalSI,
    };

    /// A quantity from a count of nano-units.
    pub fn from_nanos(nanos: i128, format: QuantityFormat) -> Self {
        Quantity { nanos, format }
    }

    /// An integer quantity (Go: `resource.NewQuantity(v, format)`).
    pub fn from_int(value: i64, format: QuantityFormat) -> Self {
        Quantity {
            nanos: i128::from(value) * NANO,
            format,
        }
    }

    /// The exact value in nano-units.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    /// The print format.
    pub fn format(&self) -> QuantityFormat {
        self.format
    }

    /// Sign of the value: -1, 0 or 1.
    pub fn sign(&self) -> i32 {
        match self.nanos.cmp(&0) {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        }
    }

    /// Go's `Quantity.Value()`: the value rounded up (away from zero) to an integer.
    pub fn value_ceil(&self) -> i128 {
        let q = self.nanos / NANO;
        let r = self.nanos % NANO;
        if r > 0 {
            q + 1
        } else if r < 0 {
            q - 1
        } else {
            q
        }
    }

    /// Go's `Quantity.MilliValue()`: the value in milli-units, rounded up (away from zero).
    pub fn milli_value_ceil(&self) -> i128 {
        const NANOS_PER_MILLI: i128 = 1_000_000;
        let q = self.nanos / NANOS_PER_MILLI;
        let r = self.nanos % NANOS_PER_MILLI;
        if r > 0 {
            q + 1
        } else if r < 0 {
            q - 1
        } else {
            q
        }
    }

    /// Whether this is a whole number of units (`Value()*1000 == MilliValue()`, the kubelet's
    /// integer-CPU test).
    pub fn is_integer(&self) -> bool {
        self.nanos % NANO == 0
    }

    /// Exact sum; `None` on overflow.
    pub fn checked_add(&self, other: &Quantity) -> Option<Quantity> {
        Some(Quantity {
            nanos: self.nanos.checked_add(other.nanos)?,
            format: self.format,
        })
    }

    /// Exact difference; `None` on overflow.
    pub fn checked_sub(&self, other: &Quantity) -> Option<Quantity> {
        Some(Quantity {
            nanos: self.nanos.checked_sub(other.nanos)?,
            format: self.format,
        })
    }

    /// Saturating sum (overflow is impossible for API-valid inputs, which stay below 2^63 units).
    pub fn add(&self, other: &Quantity) -> Quantity {
        Quantity {
            nanos: self.nanos.saturating_add(other.nanos),
            format: self.format,
        }
    }

    /// Saturating difference.
    pub fn sub(&self, other: &Quantity) -> Quantity {
        Quantity {
            nanos: self.nanos.saturating_sub(other.nanos),
            format: self.format,
        }
    }

    /// Parses a Kubernetes quantity string (`"1.5Gi"`, `"500m"`, `"1e3"`, `"-2"`).
    pub fn parse(input: &str) -> Result<Quantity, QuantityError> {
        let s = input.trim();
        let bad = || QuantityError::Format(input.to_string());
        if s.is_empty() {
            return Err(bad());
        }
        let bytes = s.as_bytes();
        let mut pos = 0;
        let mut negative = false;
        if bytes[0] == b'+' || bytes[0] == b'-' {
            negative = bytes[0] == b'-';
            pos = 1;
        }
        // Number part: digits with at most one decimal point.
        let num_start = pos;
        let mut seen_point = false;
        let mut int_digits = String::new();
        let mut frac_digits = String::new();
        while pos < bytes.len() {
            let c = bytes[pos];
            if c.is_ascii_digit() {
                if seen_point {
                    frac_digits.push(c as char);
                } else {
                    int_digits.push(c as char);
                }
            } else if c == b'.' && !seen_point {
                seen_point = true;
            } else {
                break;
            }
            pos += 1;
        }
        if pos == num_start || (int_digits.is_empty() && frac_digits.is_empty()) {
            return Err(bad());
        }
        let suffix = &s[pos..];
        let (base_is_binary, exp) = parse_suffix(suffix).ok_or_else(|| {
            if suffix
                .bytes()
                .all(|c| b"eEinumkKMGTP+-0123456789".contains(&c))
            {
                QuantityError::Suffix(input.to_string())
            } else {
                bad()
            }
        })?;
        let format = if base_is_binary {
            QuantityFormat::BinarySI
        } else if suffix.starts_with('e') || suffix.starts_with('E') {
            QuantityFormat::DecimalExponent
        } else {
            QuantityFormat::DecimalSI
        };
        let range = || QuantityError::OutOfRange(input.to_string());
        // Strip leading zeros so long zero-padded inputs still fit.
        let int_trim = int_digits.trim_start_matches('0');
        let frac_trim = frac_digits.trim_end_matches('0');
        if int_trim.len() + frac_trim.len() > 36 {
            return Err(range());
        }
        let mantissa_str = format!("{int_trim}{frac_trim}");
        let mantissa: i128 = if mantissa_str.is_empty() {
            0
        } else {
            mantissa_str.parse().map_err(|_| range())?
        };
        // value = mantissa * 10^-frac * base^exp, in nanos: * 10^9.
        let frac_len = frac_trim.len() as i64;
        let (num, den) = if base_is_binary {
            // exp is a multiple of 10 (power of two)
            let two = 2i128.checked_pow(exp as u32).ok_or_else(range)?;
            let num = mantissa.checked_mul(two).ok_or_else(range)?;
            (num, frac_len - 9)
        } else {
            (mantissa, frac_len - 9 - exp)
        };
        // nanos = num / 10^den (den may be negative → multiply)
        let nanos = if den <= 0 {
            if num == 0 {
                0
            } else {
                let m = pow10(u32::try_from(-den).map_err(|_| range())?).ok_or_else(range)?;
                num.checked_mul(m).ok_or_else(range)?
            }
        } else if den > 38 {
            // Smaller than one nano: rounds away from zero to 1n unless zero.
            i128::from(num != 0)
        } else {
            let d = pow10(den as u32).ok_or_else(range)?;
            let q = num / d;
            if num % d != 0 { q + 1 } else { q }
        };
        Ok(Quantity {
            nanos: if negative { -nanos } else { nanos },
            format,
        })
    }

    /// A byte count as the API holds memory (Go: `resource.NewQuantity(n, resource.BinarySI)`),
    /// so that [`Quantity::canonical`] gives `2Mi`, `1536Ki`, `0`.
    pub fn from_bytes(bytes: u64) -> Self {
        Self::from_int(
            i64::try_from(bytes).unwrap_or(i64::MAX),
            QuantityFormat::BinarySI,
        )
    }

    /// Canonical Kubernetes string form (Go: `Quantity.String()` after canonicalisation).
    pub fn canonical(&self) -> String {
        if self.nanos == 0 {
            return "0".to_string();
        }
        let mut format = self.format;
        if format == QuantityFormat::BinarySI
            && (self.nanos % NANO != 0 || self.nanos.abs() < 1024 * NANO)
        {
            format = QuantityFormat::DecimalSI;
        }
        let sign = if self.nanos < 0 { "-" } else { "" };
        let abs = self.nanos.unsigned_abs();
        match format {
            QuantityFormat::BinarySI => {
                let mut units = abs / NANO as u128;
                let mut k = 0;
                while k < 6 && units.is_multiple_of(1024) {
                    units /= 1024;
                    k += 1;
                }
                let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][k];
                format!("{sign}{units}{suffix}")
            }
            QuantityFormat::DecimalSI | QuantityFormat::DecimalExponent => {
                // exponent e (multiple of 3) relative to nano: value = m * 10^(e-9)
                let mut m = abs;
                let mut e: i32 = -9;
                while m.is_multiple_of(1000) && e < 18 {
                    m /= 1000;
                    e += 3;
                }
                if format == QuantityFormat::DecimalExponent {
                    if e == 0 {
                        format!("{sign}{m}")
                    } else {
                        format!("{sign}{m}e{e}")
                    }
                } else {
                    let suffix = match e {
                        -9 => "n",
                        -6 => "u",
                        -3 => "m",
                        0 => "",
                        3 => "k",
                        6 => "M",
                        9 => "G",
                        12 => "T",
                        15 => "P",
                        _ => "E",
                    };
                    format!("{sign}{m}{suffix}")
                }
            }
        }
    }

    /// The k8s-openapi wire type, in canonical form.
    pub fn to_k8s(&self) -> k8s_openapi::apimachinery::pkg::api::resource::Quantity {
        k8s_openapi::apimachinery::pkg::api::resource::Quantity(self.canonical())
    }
}

/// Returns (binary base?, exponent) for a suffix: decimal exponents are powers of ten,
/// binary ones powers of two.
fn parse_suffix(suffix: &str) -> Option<(bool, i64)> {
    let dec = |e| Some((false, e));
    match suffix {
        "" => dec(0),
        "n" => dec(-9),
        "u" => dec(-6),
        "m" => dec(-3),
        "k" => dec(3),
        "M" => dec(6),
        "G" => dec(9),
        "T" => dec(12),
        "P" => dec(15),
        "E" => dec(18),
        "Ki" => Some((true, 10)),
        "Mi" => Some((true, 20)),
        "Gi" => Some((true, 30)),
        "Ti" => Some((true, 40)),
        "Pi" => Some((true, 50)),
        "Ei" => Some((true, 60)),
        _ => {
            let rest = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))?;
            let digits = rest
                .strip_prefix('+')
                .or_else(|| rest.strip_prefix('-'))
                .unwrap_or(rest);
            if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) || digits.len() > 4
            {
                return None;
            }
            let e: i64 = rest.parse().ok()?;
            dec(e)
        }
    }
}

/// The resource name of a huge page size (Go: `v1helper.HugePageResourceName`): `hugepages-`
/// and the page size in bytes as a binary-SI quantity (`2097152` → `hugepages-2Mi`).
pub fn hugepage_resource_name(page_size_bytes: u64) -> String {
    format!(
        "hugepages-{}",
        Quantity::from_bytes(page_size_bytes).canonical()
    )
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn byte_counts_and_hugepage_names_print_as_go_prints_them() {
        assert_eq!(Quantity::from_bytes(3 * (2 << 20)).canonical(), "6Mi");
        assert_eq!(Quantity::from_bytes(1536 << 10).canonical(), "1536Ki");
        assert_eq!(Quantity::from_bytes(0).canonical(), "0");
        // Below 1Ki Go's canonical form is decimal.
        assert_eq!(Quantity::from_bytes(1000).canonical(), "1k");
        assert_eq!(hugepage_resource_name(2 << 20), "hugepages-2Mi");
        assert_eq!(hugepage_resource_name(1 << 30), "hugepages-1Gi");
    }

    #[test]
    fn parses_decimal_binary_milli_and_exponent_forms() {
        assert_eq!(q("1").nanos(), NANO);
        assert_eq!(q("500m").nanos(), NANO / 2);
        assert_eq!(q("1k").nanos(), 1000 * NANO);
        assert_eq!(q("1Ki").nanos(), 1024 * NANO);
        assert_eq!(q("1Gi"), q("1024Mi"));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("1E-3"), q("1m"));
        assert_eq!(q("1.5Gi").nanos(), 1536 * 1024 * 1024 * NANO);
        assert_eq!(q("-2").nanos(), -2 * NANO);
        assert_eq!(q(".5").nanos(), NANO / 2);
        assert_eq!(q("+1n").nanos(), 1);
        assert_eq!(q("0.1n").nanos(), 1, "sub-nano precision rounds up");
        assert_eq!(q("-0.1n").nanos(), -1, "rounding is away from zero");
        assert_eq!(q("8Ei").nanos(), 8 * (1i128 << 60) * NANO);
    }

    #[test]
    fn rejects_malformed_quantities() {
        for bad in ["", "abc", "1.2.3", "1Qi", "Gi", "1 Gi", "--1", "1e", "1ee3"] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?} must be rejected");
        }
        assert!(Quantity::parse("1e9999").is_err());
    }

    #[test]
    fn canonical_form_matches_kubernetes() {
        assert_eq!(q("1024Mi").canonical(), "1Gi");
        assert_eq!(q("1000").canonical(), "1k");
        assert_eq!(q("1.5").canonical(), "1500m");
        assert_eq!(q("1536").canonical(), "1536");
        assert_eq!(q("1536Ki").canonical(), "1536Ki");
        assert_eq!(q("0.5Ki").canonical(), "512");
        assert_eq!(q("1e3").canonical(), "1e3");
        assert_eq!(q("0Gi").canonical(), "0");
        assert_eq!(
            Quantity::from_int(4 << 30, QuantityFormat::BinarySI).canonical(),
            "4Gi"
        );
    }

    #[test]
    fn value_is_the_ceiling_to_an_integer() {
        assert_eq!(q("500m").value_ceil(), 1);
        assert_eq!(q("1").value_ceil(), 1);
        assert_eq!(q("1001m").value_ceil(), 2);
        assert_eq!(q("-500m").value_ceil(), -1);
    }

    proptest! {
        #[test]
        fn canonical_form_round_trips(n in -1_000_000_000_000i64..1_000_000_000_000i64, scale in 0u32..4) {
            let nanos = i128::from(n) * 10i128.pow(scale * 3);
            for format in [QuantityFormat::DecimalSI, QuantityFormat::BinarySI, QuantityFormat::DecimalExponent] {
                let x = Quantity::from_nanos(nanos, format);
                let back = Quantity::parse(&x.canonical()).unwrap();
                prop_assert_eq!(back.nanos(), nanos);
            }
        }

        #[test]
        fn addition_and_subtraction_are_exact(a in any::<i64>(), b in any::<i64>()) {
            let x = Quantity::from_nanos(i128::from(a), QuantityFormat::DecimalSI);
            let y = Quantity::from_nanos(i128::from(b), QuantityFormat::DecimalSI);
            prop_assert_eq!(x.add(&y).sub(&y), x);
            prop_assert_eq!(x.add(&y).nanos(), i128::from(a) + i128::from(b));
            prop_assert_eq!(x.cmp(&y), a.cmp(&b));
        }

        #[test]
        fn binary_and_decimal_suffixes_agree(n in 0i64..1_000_000) {
            let ki = Quantity::parse(&format!("{n}Ki")).unwrap();
            let plain = Quantity::parse(&format!("{}", i128::from(n) * 1024)).unwrap();
            prop_assert_eq!(ki, plain);
            let k = Quantity::parse(&format!("{n}k")).unwrap();
            let e3 = Quantity::parse(&format!("{n}e3")).unwrap();
            prop_assert_eq!(k, e3);
        }
    }
}
