//! Fixed-time property fuzzing, shared by the fuzz tests of several crates (each includes this
//! file with `#[path]`; it is test code, not a crate). proptest bounds a run by case count;
//! CI wants a fixed time, so [`fuzz_for`] runs a property in rounds of fresh cases, a new seed
//! per round, until `DEVICELET_FUZZ_SECONDS` have passed. Unset, it returns at once (the
//! crates' `proptest!` blocks are the fixed-size pass of a plain `cargo test`).

use std::fmt::Debug;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

/// Cases per round: small enough that the deadline is overshot by at most one round.
const ROUND: u32 = 64;

/// Runs `test` on values of `strategy` for `DEVICELET_FUZZ_SECONDS` seconds. A failure panics
/// with the round's seed (`DEVICELET_FUZZ_SEED` replays it) and the shrunk input.
pub fn fuzz_for<S>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S: Strategy,
    S::Value: Debug,
{
    let env = |key: &str| std::env::var(key).ok().and_then(|v| v.parse::<u64>().ok());
    let Some(seconds) = env("DEVICELET_FUZZ_SECONDS") else {
        return;
    };
    let mut seed = env("DEVICELET_FUZZ_SEED").unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let mut cases = 0u64;
    while Instant::now() < deadline {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let config = Config {
            cases: ROUND,
            failure_persistence: None,
            ..Config::default()
        };
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
        let mut runner = TestRunner::new_with_rng(config, rng);
        if let Err(e) = runner.run(&strategy, &test) {
            panic!("fuzz {name}: DEVICELET_FUZZ_SEED={seed}: {e}");
        }
        cases += u64::from(ROUND);
        seed = seed.wrapping_add(1);
    }
    eprintln!(
        "fuzz {name}: {cases} cases in {:.1} s, no failure",
        started.elapsed().as_secs_f64()
    );
}
