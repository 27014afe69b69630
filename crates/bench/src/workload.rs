//! Workload generators: what the bench sends, fixed by a seed.
//!
//! Prompts are built from [`WORDS`], common English words that are each one
//! token, with or without a leading space, in the default model's GPT-2 style
//! vocabulary. Lengths given to the generators are counted in words: for
//! the default model N space-separated words are exactly N tokens (a test
//! checks it), and other BPE vocabularies come close. The formatting around
//! them (`Question:`, `User:`, newlines) adds a few tokens more. The report
//! never trusts the estimate: it takes the true prompt token counts from
//! the server's usage.
//!
//! Every generator is an endless stream of [`Session`]s: the driver decides
//! how many to take. A session is one request, except in `multi-turn`, where
//! it is a chat whose turns are sent one after another, each resending the
//! whole history (see [`chat_prompt`]).

use std::{collections::VecDeque, path::Path, str::FromStr};

use rand::{Rng, SeedableRng, rngs::StdRng, seq::SliceRandom};
use serde::Deserialize;

/// An inclusive range of lengths, written `N` or `MIN-MAX` on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LenRange {
    /// Shortest length.
    pub(crate) min: u32,
    /// Longest length.
    pub(crate) max: u32,
}

impl LenRange {
    fn sample(self, rng: &mut StdRng) -> u32 {
        rng.random_range(self.min..=self.max)
    }
}

/// A `--prompt-len`-style value that is not a length or a length range.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BadLenRange {
    /// A part is not a number.
    #[error("{0:?} is not a length: write N or MIN-MAX, e.g. 128-512")]
    NotALength(String),
    /// Zero, or the lower end above the upper one.
    #[error("{0:?} is not a length range: need 1 <= MIN <= MAX")]
    Empty(String),
}

impl FromStr for LenRange {
    type Err = BadLenRange;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let number = |part: &str| {
            part.trim()
                .parse::<u32>()
                .map_err(|_| BadLenRange::NotALength(s.to_string()))
        };
        let (min, max) = match s.split_once('-') {
            Some((lo, hi)) => (number(lo)?, number(hi)?),
            None => (number(s)?, number(s)?),
        };
        if min == 0 || min > max {
            return Err(BadLenRange::Empty(s.to_string()));
        }
        Ok(LenRange { min, max })
    }
}

impl std::fmt::Display for LenRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}-{}", self.min, self.max)
        }
    }
}

/// One prompt of a `file` workload.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct FilePrompt {
    /// The prompt text, sent as is.
    pub(crate) prompt: String,
    /// Output length for this prompt; `--output-len` when absent.
    #[serde(default)]
    pub(crate) max_tokens: Option<u32>,
}

/// What to generate; built from the command line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum WorkloadSpec {
    /// Independent prompts of random length.
    Random {
        /// Prompt length in words.
        input: LenRange,
        /// `max_tokens` of each request.
        output: LenRange,
    },
    /// `groups` system prompts of `prefix_len` words, each followed by
    /// `questions` different questions.
    SharedPrefix {
        /// Number of distinct system prompts (K).
        groups: u32,
        /// Words in each system prompt (P).
        prefix_len: u32,
        /// Questions sharing each system prompt per round (M).
        questions: u32,
        /// Question length in words.
        question: LenRange,
        /// `max_tokens` of each request.
        output: LenRange,
    },
    /// Chats of `turns` user turns.
    MultiTurn {
        /// User turns per chat.
        turns: u32,
        /// Length of each user turn in words.
        turn: LenRange,
        /// `max_tokens` of each turn.
        output: LenRange,
    },
    /// Prompts read from a JSONL file, in file order.
    File {
        /// The parsed lines.
        prompts: Vec<FilePrompt>,
        /// `max_tokens` for lines that do not set it.
        output: LenRange,
    },
}

/// One request of a session.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Turn {
    /// The prompt, or in a chat the user's message.
    pub(crate) text: String,
    /// Most tokens to generate.
    pub(crate) max_tokens: u32,
}

/// Requests that belong together: one prompt, or one chat.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Session {
    /// Position in the stream, from 0; also seeds the session's sampling.
    pub(crate) id: u64,
    /// The requests, sent in order, each after the previous one finished.
    pub(crate) turns: Vec<Turn>,
    /// Whether each turn resends the chat history (see [`chat_prompt`]).
    pub(crate) chat: bool,
    /// The shared prefix's group in `shared-prefix`.
    pub(crate) group: Option<u32>,
}

/// An endless, seeded stream of sessions.
#[derive(Debug)]
pub(crate) struct Workload {
    spec: WorkloadSpec,
    rng: StdRng,
    next_id: u64,
    prefixes: Vec<String>,
    round: VecDeque<Session>,
    file_pos: usize,
}

impl Workload {
    /// The stream for `spec`; equal seeds give equal streams.
    pub(crate) fn new(spec: WorkloadSpec, seed: u64) -> Workload {
        let mut rng = StdRng::seed_from_u64(seed);
        let prefixes = match &spec {
            WorkloadSpec::SharedPrefix {
                groups, prefix_len, ..
            } => (0..*groups).map(|_| words(&mut rng, *prefix_len)).collect(),
            _ => Vec::new(),
        };
        Workload {
            spec,
            rng,
            next_id: 0,
            prefixes,
            round: VecDeque::new(),
            file_pos: 0,
        }
    }

    /// Requests in one natural pass of the workload: K x M for
    /// `shared-prefix`, the line count for `file`, 100 otherwise. Used when
    /// neither `--num-prompts` nor `--duration` is given.
    pub(crate) fn natural_requests(&self) -> usize {
        match &self.spec {
            WorkloadSpec::SharedPrefix {
                groups, questions, ..
            } => (*groups as usize) * (*questions as usize),
            WorkloadSpec::File { prompts, .. } => prompts.len(),
            WorkloadSpec::Random { .. } | WorkloadSpec::MultiTurn { .. } => 100,
        }
    }

    /// The next session. `file` wraps around and the others never end;
    /// `None` only when the spec can produce nothing (no file lines, no
    /// groups, no turns).
    pub(crate) fn next_session(&mut self) -> Option<Session> {
        let rng = &mut self.rng;
        let mut session = match &self.spec {
            WorkloadSpec::Random { input, output } => {
                single(sample_words(rng, *input), output.sample(rng))
            }
            WorkloadSpec::SharedPrefix { .. } => {
                if self.round.is_empty() {
                    self.round = self.shared_prefix_round();
                }
                self.round.pop_front()?
            }
            WorkloadSpec::MultiTurn {
                turns,
                turn,
                output,
            } => Session {
                id: 0,
                turns: (0..*turns)
                    .map(|_| Turn {
                        text: sample_words(rng, *turn),
                        max_tokens: output.sample(rng),
                    })
                    .collect(),
                chat: true,
                group: None,
            },
            WorkloadSpec::File { prompts, output } => {
                let line = prompts.get(self.file_pos % prompts.len().max(1))?;
                self.file_pos += 1;
                let max_tokens = line.max_tokens.unwrap_or_else(|| output.sample(rng));
                single(line.prompt.clone(), max_tokens)
            }
        };
        if session.turns.is_empty() {
            return None;
        }
        session.id = self.next_id;
        self.next_id += 1;
        Some(session)
    }

    /// K x M sessions, every group's questions after its system prompt,
    /// shuffled so that tenants interleave as they would in a live service.
    fn shared_prefix_round(&mut self) -> VecDeque<Session> {
        let WorkloadSpec::SharedPrefix {
            questions,
            question,
            output,
            ..
        } = &self.spec
        else {
            return VecDeque::new();
        };
        let rng = &mut self.rng;
        let mut round = Vec::new();
        for (group, prefix) in self.prefixes.iter().enumerate() {
            for _ in 0..*questions {
                let text = format!(
                    "{prefix}\nQuestion: {}\nAnswer:",
                    sample_words(rng, *question)
                );
                let mut session = single(text, output.sample(rng));
                session.group = Some(group as u32);
                round.push(session);
            }
        }
        round.shuffle(rng);
        round.into()
    }
}

fn single(text: String, max_tokens: u32) -> Session {
    Session {
        id: 0,
        turns: vec![Turn { text, max_tokens }],
        chat: false,
        group: None,
    }
}

/// The prompt of a chat turn: the history so far, then the user's message.
pub(crate) fn chat_prompt(history: &str, user: &str) -> String {
    format!("{history}User: {user}\nAssistant:")
}

/// The history after a turn: its prompt followed by the model's reply.
pub(crate) fn chat_history(history: &str, user: &str, reply: &str) -> String {
    format!("{}{reply}\n", chat_prompt(history, user))
}

/// Reads a JSONL prompt file: one `{"prompt": "...", "max_tokens": N}`
/// object per line (`max_tokens` optional); blank lines are skipped.
pub(crate) fn read_prompt_file(path: &Path) -> Result<Vec<FilePrompt>, crate::BenchError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        crate::BenchError::PromptFile(format!("cannot read prompt file {}: {e}", path.display()))
    })?;
    parse_prompt_lines(&text)
        .map_err(|e| crate::BenchError::PromptFile(format!("{}:{e}", path.display())))
}

/// Why a prompt file's lines cannot be used; the message starts with the
/// 1-based line number, to follow the file's path and a colon.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PromptLinesError {
    /// A line is not a prompt object.
    #[error(
        "{line}: {source}; each line must be a JSON object like \
         {{\"prompt\": \"Hello\", \"max_tokens\": 64}}"
    )]
    Json {
        /// 1-based line number.
        line: usize,
        /// What the JSON reader said.
        source: serde_json::Error,
    },
    /// An empty prompt, or `max_tokens` 0.
    #[error("{line}: \"prompt\" must not be empty and \"max_tokens\" must be at least 1")]
    Empty {
        /// 1-based line number.
        line: usize,
    },
    /// No line holds a prompt.
    #[error(" no prompts: the file holds no JSON lines")]
    NoPrompts,
}

/// Parses JSONL prompt lines; an error names the 1-based line number.
pub(crate) fn parse_prompt_lines(text: &str) -> Result<Vec<FilePrompt>, PromptLinesError> {
    let mut prompts = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let prompt: FilePrompt =
            serde_json::from_str(line).map_err(|source| PromptLinesError::Json {
                line: index + 1,
                source,
            })?;
        if prompt.prompt.is_empty() || prompt.max_tokens == Some(0) {
            return Err(PromptLinesError::Empty { line: index + 1 });
        }
        prompts.push(prompt);
    }
    if prompts.is_empty() {
        return Err(PromptLinesError::NoPrompts);
    }
    Ok(prompts)
}

/// A length drawn from `range`, then that many words.
fn sample_words(rng: &mut StdRng, range: LenRange) -> String {
    let n = range.sample(rng);
    words(rng, n)
}

/// `n` words drawn from [`WORDS`], separated by spaces.
fn words(rng: &mut StdRng, n: u32) -> String {
    let mut text = String::with_capacity(n as usize * 7);
    for i in 0..n {
        if i > 0 {
            text.push(' ');
        }
        text.push_str(WORDS[rng.random_range(0..WORDS.len())]);
    }
    text
}

/// Words that are one token each in the default model's vocabulary.
#[rustfmt::skip]
pub(crate) const WORDS: [&str; 267] = [
    "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world",
    "school", "state", "family", "student", "group", "country", "problem", "hand", "part", "place",
    "case", "week", "company", "system", "program", "question", "work", "government", "number",
    "night", "point", "home", "water", "room", "mother", "area", "money", "story", "fact", "month",
    "lot", "right", "study", "book", "eye", "job", "word", "business", "issue", "side", "kind",
    "head", "house", "service", "friend", "father", "power", "hour", "game", "line", "end",
    "member", "law", "car", "city", "community", "name", "president", "team", "minute", "idea",
    "kid", "body", "information", "back", "parent", "face", "others", "level", "office", "door",
    "health", "person", "art", "war", "history", "party", "result", "change", "reason", "research",
    "girl", "moment", "air", "teacher", "force", "education", "foot", "boy", "age", "policy",
    "process", "music", "market", "sense", "nation", "plan", "college", "interest", "death",
    "experience", "effect", "use", "class", "control", "care", "field", "development", "role",
    "rate", "heart", "drug", "show", "leader", "light", "voice", "wife", "mind", "price", "report",
    "decision", "son", "view", "relationship", "town", "road", "arm", "difference", "value",
    "building", "action", "model", "season", "tax", "director", "position", "player", "record",
    "paper", "space", "ground", "form", "event", "official", "matter", "center", "site", "project",
    "activity", "star", "table", "need", "court", "oil", "cost", "industry", "figure", "street",
    "image", "phone", "data", "picture", "practice", "piece", "land", "product", "doctor", "wall",
    "patient", "worker", "news", "test", "movie", "north", "love", "support", "technology", "step",
    "baby", "computer", "type", "attention", "film", "tree", "source", "organization", "hair",
    "window", "evidence", "population", "summer", "fire", "river", "bird", "stone", "green",
    "small", "large", "little", "great", "old", "young", "long", "short", "high", "early", "late",
    "good", "new", "first", "last", "other", "same", "able", "black", "white", "red", "blue",
    "simple", "happy", "quiet", "bright", "cold", "warm", "open", "clear", "strong", "soft",
    "free", "full", "easy", "hard", "real", "best", "whole", "public", "local", "social",
    "national", "natural", "human", "common", "certain", "general", "special", "main", "major",
    "final", "poor", "recent", "private", "political", "medical", "personal", "physical",
    "financial",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn range(min: u32, max: u32) -> LenRange {
        LenRange { min, max }
    }

    fn word_count(text: &str) -> u32 {
        text.split_whitespace().count() as u32
    }

    fn take(spec: &WorkloadSpec, seed: u64, n: usize) -> Vec<Session> {
        let mut workload = Workload::new(spec.clone(), seed);
        (0..n).map(|_| workload.next_session().unwrap()).collect()
    }

    fn shared_spec() -> WorkloadSpec {
        WorkloadSpec::SharedPrefix {
            groups: 3,
            prefix_len: 40,
            questions: 5,
            question: range(4, 9),
            output: range(8, 8),
        }
    }

    #[test]
    fn len_range_parses_single_values_and_ranges_and_rejects_nonsense() {
        assert_eq!("64".parse::<LenRange>().unwrap(), range(64, 64));
        assert_eq!("16-128".parse::<LenRange>().unwrap(), range(16, 128));
        assert_eq!(range(16, 128).to_string(), "16-128");
        for bad in ["", "0", "9-3", "a-b", "-5", "3-"] {
            assert!(bad.parse::<LenRange>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn random_prompts_and_outputs_stay_within_their_ranges() {
        let spec = WorkloadSpec::Random {
            input: range(5, 20),
            output: range(3, 7),
        };
        let sessions = take(&spec, 7, 300);
        let lengths: Vec<u32> = sessions
            .iter()
            .map(|s| word_count(&s.turns[0].text))
            .collect();
        assert!(lengths.iter().all(|n| (5..=20).contains(n)));
        assert!(
            lengths.contains(&5) && lengths.contains(&20),
            "ends of the range are drawn"
        );
        assert!(
            sessions
                .iter()
                .all(|s| (3..=7).contains(&s.turns[0].max_tokens))
        );
        assert!(sessions.iter().all(|s| s.turns.len() == 1 && !s.chat));
        let ids: Vec<u64> = sessions.iter().map(|s| s.id).collect();
        assert_eq!(ids, (0..300).collect::<Vec<u64>>());
    }

    #[test]
    fn every_word_is_a_plain_lowercase_word() {
        assert!(
            WORDS
                .iter()
                .all(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase()))
        );
        let distinct: std::collections::HashSet<_> = WORDS.iter().collect();
        assert_eq!(distinct.len(), WORDS.len());
    }

    #[test]
    fn a_prompt_of_n_words_is_n_tokens_for_the_default_model() {
        let path = zinfer_fetch::test_model_path().unwrap();
        let tokenizer = &zinfer_text::ModelTokenizer::open(&path).unwrap();
        for word in WORDS {
            assert_eq!(tokenizer.encode(word).unwrap().len(), 1, "{word:?}");
            assert_eq!(
                tokenizer.encode(&format!(" {word}")).unwrap().len(),
                1,
                "{word:?}"
            );
        }
        let mut rng = StdRng::seed_from_u64(0);
        let text = words(&mut rng, 500);
        assert_eq!(tokenizer.encode(&text).unwrap().len(), 500);
    }

    #[test]
    fn shared_prefix_makes_k_groups_of_m_questions_behind_identical_prefixes() {
        let sessions = take(&shared_spec(), 1, 15);
        let mut by_group: std::collections::BTreeMap<u32, Vec<&str>> = Default::default();
        for session in &sessions {
            let text = session.turns[0].text.as_str();
            let (prefix, question) = text.split_once("\nQuestion: ").unwrap();
            assert_eq!(word_count(prefix), 40);
            let question = question.strip_suffix("\nAnswer:").unwrap();
            assert!((4..=9).contains(&word_count(question)));
            by_group
                .entry(session.group.unwrap())
                .or_default()
                .push(prefix);
        }
        assert_eq!(by_group.len(), 3);
        for prefixes in by_group.values() {
            assert_eq!(prefixes.len(), 5);
            assert!(prefixes.iter().all(|p| p == &prefixes[0]));
        }
        let firsts: std::collections::HashSet<_> = by_group.values().map(|p| p[0]).collect();
        assert_eq!(firsts.len(), 3, "groups have different prefixes");
        let order: Vec<u32> = sessions.iter().map(|s| s.group.unwrap()).collect();
        assert_ne!(
            order,
            {
                let mut sorted = order.clone();
                sorted.sort();
                sorted
            },
            "groups are interleaved, not sent one after another"
        );
    }

    #[test]
    fn shared_prefix_rounds_keep_the_prefixes_and_draw_new_questions() {
        let sessions = take(&shared_spec(), 1, 30);
        let prefix = |s: &Session| s.turns[0].text.split_once('\n').unwrap().0.to_string();
        let first: std::collections::HashSet<_> = sessions[..15].iter().map(prefix).collect();
        let second: std::collections::HashSet<_> = sessions[15..].iter().map(prefix).collect();
        assert_eq!(first, second);
        assert_ne!(
            sessions[..15]
                .iter()
                .map(|s| &s.turns[0].text)
                .collect::<Vec<_>>(),
            sessions[15..]
                .iter()
                .map(|s| &s.turns[0].text)
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn multi_turn_chats_grow_by_resending_the_history() {
        let spec = WorkloadSpec::MultiTurn {
            turns: 3,
            turn: range(2, 6),
            output: range(4, 4),
        };
        let session = take(&spec, 3, 1).remove(0);
        assert!(session.chat);
        assert_eq!(session.turns.len(), 3);
        let mut history = String::new();
        let mut previous_prompt = String::new();
        for (i, turn) in session.turns.iter().enumerate() {
            assert!((2..=6).contains(&word_count(&turn.text)));
            let prompt = chat_prompt(&history, &turn.text);
            assert!(
                prompt.starts_with(&previous_prompt),
                "turn {i} resends the history"
            );
            assert!(prompt.len() > previous_prompt.len());
            assert!(prompt.ends_with(&format!("User: {}\nAssistant:", turn.text)));
            history = chat_history(&history, &turn.text, " a reply");
            assert!(history.starts_with(&prompt) && history.ends_with(" a reply\n"));
            previous_prompt = history.clone();
        }
    }

    #[test]
    fn equal_seeds_give_equal_workloads_and_different_seeds_do_not() {
        let random = WorkloadSpec::Random {
            input: range(1, 50),
            output: range(1, 50),
        };
        for spec in [random, shared_spec()] {
            assert_eq!(take(&spec, 42, 20), take(&spec, 42, 20));
            assert_ne!(take(&spec, 42, 20), take(&spec, 43, 20));
        }
    }

    #[test]
    fn file_prompts_are_sent_in_order_and_wrap_around() {
        let prompts = parse_prompt_lines(
            "{\"prompt\": \"one\", \"max_tokens\": 5}\n\n{\"prompt\": \"two\"}\n",
        )
        .unwrap();
        let spec = WorkloadSpec::File {
            prompts,
            output: range(9, 9),
        };
        assert_eq!(Workload::new(spec.clone(), 0).natural_requests(), 2);
        let turns: Vec<Turn> = take(&spec, 0, 3)
            .into_iter()
            .map(|s| s.turns[0].clone())
            .collect();
        let expected = [("one", 5), ("two", 9), ("one", 5)];
        for (turn, (text, max_tokens)) in turns.iter().zip(expected) {
            assert_eq!((turn.text.as_str(), turn.max_tokens), (text, max_tokens));
        }
    }

    #[test]
    fn bad_file_lines_are_reported_with_their_line_number() {
        let bad_json = parse_prompt_lines("{\"prompt\": \"ok\"}\n\n{\"prompt\": 3}\n")
            .unwrap_err()
            .to_string();
        assert!(bad_json.starts_with("3: "), "{bad_json}");
        assert!(bad_json.contains("JSON object like"), "{bad_json}");
        let not_json = parse_prompt_lines("hello\n").unwrap_err().to_string();
        assert!(not_json.starts_with("1: "), "{not_json}");
        let zero = parse_prompt_lines("{\"prompt\": \"x\", \"max_tokens\": 0}")
            .unwrap_err()
            .to_string();
        assert!(
            zero.starts_with("1: ") && zero.contains("at least 1"),
            "{zero}"
        );
        assert!(
            parse_prompt_lines("\n \n")
                .unwrap_err()
                .to_string()
                .contains("no prompts")
        );
    }

    #[test]
    fn a_workload_that_can_produce_nothing_ends_at_once() {
        let spec = WorkloadSpec::File {
            prompts: Vec::new(),
            output: range(1, 1),
        };
        assert_eq!(Workload::new(spec, 0).next_session(), None);
    }
}
