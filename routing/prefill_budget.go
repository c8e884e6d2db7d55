package routing

import "sync/atomic"

// lowerPrefill counts the prompt tokens of the standard and batch requests a worker is
// prefilling (sent, first token not back yet; a prompt sent in pieces counts one piece), which
// the prefill budget bounds while interactive requests are present (see
// ConcurrencyConfig.LowerPrefillTokens). Safe for concurrent use.
type lowerPrefill struct{ tokens atomic.Int64 }

// start counts a lower-class prefill of tokens sent now.
func (c *lowerPrefill) start(tokens int64) { c.tokens.Add(tokens) }

// done uncounts a lower-class prefill of tokens: its first token came back, or it ended.
func (c *lowerPrefill) done(tokens int64) { c.tokens.Add(-tokens) }
