//! What a test does when the machine cannot run its real parts (not root, a tool missing): outside
//! CI it says so and returns; in CI (`CI` set to anything but `false`/`0`/empty, as `.ci/run` and
//! every CI service set it) it fails. A skipped test is not a passing one: CI must never go green
//! without having run the namespace, data-path, runtime and installer tests.

/// True when running under CI (`CI=true`, `CI=1`, …).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false" | "FALSE" | "False"))
}

/// Reports that `test` cannot run here because of `why`: panics under CI, prints a notice
/// otherwise. The caller returns right after.
#[track_caller]
pub fn skip(test: &str, why: &str) {
    if in_ci() {
        panic!("{test} cannot run its real parts: {why} (CI is set: a skipped test fails the run)");
    }
    eprintln!("NOTICE: {test} skipped: {why}");
}
