//! A YAML document as a tree whose every node knows its line, built from yaml-rust2's
//! event parser, with duplicate mapping keys rejected.
//!
//! envoyproxy/ratelimit's files are small; what matters is that every error names the
//! file and line, which serde-based YAML crates do not give for values checked after
//! deserialization, and that a key written twice is an error instead of the last one
//! silently winning. Anchors and aliases are expanded (an alias is a copy).

use std::collections::HashMap;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// One node, at a 1-based line.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Line of the node's first character.
    pub line: usize,
    /// What it is.
    pub kind: Kind,
}

/// A node's content.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// A scalar as written; `plain` is false for quoted and block scalars (so `"true"`
    /// is a string, `true` a boolean).
    Scalar {
        /// The text.
        text: String,
        /// Unquoted.
        plain: bool,
    },
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in file order (keys are unique).
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// A plain scalar that means null (`~`, `null`, or nothing).
    pub fn is_null(&self) -> bool {
        matches!(&self.kind, Kind::Scalar { text, plain: true } if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }

    /// What the node is, for error messages.
    pub fn what(&self) -> &'static str {
        match &self.kind {
            Kind::Scalar { .. } if self.is_null() => "null",
            Kind::Scalar { .. } => "a scalar",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a mapping",
        }
    }
}

/// A document that is not valid YAML, or has a key twice: the message and its line.
#[derive(Debug, Clone, PartialEq)]
pub struct YamlError {
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Parses the first document of `text` (`None`: the file is empty).
pub fn parse(text: &str) -> Result<Option<Node>, YamlError> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut builder, false).map_err(|e| YamlError {
        line: e.marker().line(),
        message: e.info().to_owned(),
    })?;
    if let Some(e) = builder.error {
        return Err(e);
    }
    Ok(builder.done)
}

/// A container being built: its line, anchor, and children so far.
enum Open {
    Seq(usize, usize, Vec<Node>),
    Map(usize, usize, Vec<(Node, Node)>, Option<Node>),
}

#[derive(Default)]
struct Builder {
    stack: Vec<Open>,
    anchors: HashMap<usize, Node>,
    done: Option<Node>,
    error: Option<YamlError>,
}

impl Builder {
    /// Adds a finished node to the container on top (or makes it the document).
    fn push(&mut self, node: Node, anchor: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, node.clone());
        }
        match self.stack.last_mut() {
            None => {
                if self.done.is_none() {
                    self.done = Some(node);
                }
            }
            Some(Open::Seq(_, _, items)) => items.push(node),
            Some(Open::Map(_, _, pairs, key)) => match key.take() {
                None => {
                    if let Kind::Scalar { text, .. } = &node.kind {
                        if let Some((first, _)) = pairs.iter().find(
                            |(k, _)| matches!(&k.kind, Kind::Scalar { text: t, .. } if t == text),
                        ) {
                            if self.error.is_none() {
                                self.error = Some(YamlError {
                                    line: node.line,
                                    message: format!(
                                        "duplicate key '{text}' (first at line {})",
                                        first.line
                                    ),
                                });
                            }
                        }
                    }
                    *key = Some(node);
                }
                Some(k) => pairs.push((k, node)),
            },
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let line = mark.line();
        match ev {
            Event::Scalar(text, style, anchor, _) => {
                let plain = style == TScalarStyle::Plain;
                self.push(
                    Node {
                        line,
                        kind: Kind::Scalar { text, plain },
                    },
                    anchor,
                );
            }
            Event::SequenceStart(anchor, _) => self.stack.push(Open::Seq(line, anchor, Vec::new())),
            Event::MappingStart(anchor, _) => {
                self.stack.push(Open::Map(line, anchor, Vec::new(), None))
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (node, anchor) = match self.stack.pop() {
                    Some(Open::Seq(line, anchor, items)) => (
                        Node {
                            line,
                            kind: Kind::Seq(items),
                        },
                        anchor,
                    ),
                    Some(Open::Map(line, anchor, pairs, _)) => (
                        Node {
                            line,
                            kind: Kind::Map(pairs),
                        },
                        anchor,
                    ),
                    None => return,
                };
                self.push(node, anchor);
            }
            Event::Alias(id) => {
                let node = self.anchors.get(&id).cloned().unwrap_or(Node {
                    line,
                    kind: Kind::Scalar {
                        text: String::new(),
                        plain: true,
                    },
                });
                self.push(Node { line, ..node }, 0);
            }
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_carry_their_lines() {
        let doc = parse("domain: a\ndescriptors:\n  - key: k\n    value: \"v\"\n")
            .unwrap()
            .unwrap();
        let Kind::Map(pairs) = &doc.kind else {
            panic!("{doc:?}")
        };
        assert_eq!(pairs[1].0.line, 2);
        let Kind::Seq(items) = &pairs[1].1.kind else {
            panic!()
        };
        let Kind::Map(inner) = &items[0].kind else {
            panic!()
        };
        assert_eq!(inner[1].1.line, 4);
        assert_eq!(
            inner[1].1.kind,
            Kind::Scalar {
                text: "v".into(),
                plain: false
            }
        );
    }

    #[test]
    fn duplicate_keys_and_syntax_errors_name_their_line() {
        let e = parse("domain: a\nx: 1\ndomain: b\n").unwrap_err();
        assert_eq!(e.line, 3, "{e:?}");
        assert!(e
            .message
            .contains("duplicate key 'domain' (first at line 1)"));
        let e = parse("a: [1, 2\nb: 3\n").unwrap_err();
        assert!(e.line >= 1, "{e:?}");
        assert_eq!(parse("").unwrap(), None);
    }

    #[test]
    fn aliases_are_copies() {
        let doc = parse("a: &x {k: 1}\nb: *x\n").unwrap().unwrap();
        let Kind::Map(pairs) = &doc.kind else {
            panic!()
        };
        assert_eq!(pairs[0].1.kind, pairs[1].1.kind);
    }
}
