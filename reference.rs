//! Plain scalar versions of every op: the yardstick for tests.
