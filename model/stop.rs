//! Stop strings over streamed text: text that could still become a stop
//! string is held back, so a caller never sees a stop string or a piece of
//! one that then has to be taken back.

/// Finds the first of a set of stop strings in text arriving in pieces.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released (a possible start of a stop string).
    held: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored (they would match before any text).
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Adds `text`; returns the text that is now safe to release, and whether
    /// a stop string was found (then the returned text ends just before it
    /// and the rest is dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.held), false);
        }
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            let mut out = std::mem::take(&mut self.held);
            out.truncate(at);
            return (out, true);
        }
        // Keep the longest tail that is the start of some stop string.
        let keep = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let rest = self.held.split_off(keep);
        (std::mem::replace(&mut self.held, rest), false)
    }

    /// Releases whatever is held (generation ended without a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = Vec::new();
        for p in pieces {
            let (text, hit) = m.push(p);
            out.push(text);
            if hit {
                return (out, true);
            }
        }
        out.push(m.finish());
        (out, false)
    }

    #[test]
    fn holds_back_a_possible_stop_and_cuts_at_it() {
        let (out, hit) = run(&["\n\n"], &["Paris", ".\n", "\nThe"]);
        assert_eq!(out, ["Paris", ".", ""]);
        assert!(hit);
    }

    #[test]
    fn releases_a_false_start() {
        let (out, hit) = run(&["END"], &["a E", "Nx", " b"]);
        assert_eq!(out.concat(), "a ENx b");
        assert_eq!(out[0], "a ");
        assert!(!hit);
    }

    #[test]
    fn earliest_of_several_stops_wins_and_multibyte_text_is_safe() {
        let (out, hit) = run(&["é!", "b"], &["aé", "!b"]);
        assert_eq!(out.concat(), "a");
        assert!(hit);
    }
}
