//! Rewards: a math answer verifier equivalent to math-verify and the multiple-choice grader.
