package bench

import (
	"math/rand/v2"
	"strings"
)

// vocabulary holds short common English words, each one token for the usual BPE tokenizers, so a
// text of n words is close to n tokens.
var vocabulary = strings.Fields(`
the of and to in is was for that on as with by he at from his it an were are which this be or
has had not but first one their its new after who they two her she been other when there all
during into school time may years more most only over city some world would where later up such
used many can state about national out known university united then made also team film year
part well game three between under while being called season him since both these series
against early life through before could war several american county including four end book
music make long what group five main each back same people just work like high name day word
line house water river room place field light point hand power night south north east west open
road great small large white black green blue red gold stone tree food table door area form sea
land fire king town club band song album story plan rule test case data model cache block queue
token share class route node graph value order price market trade
`)

// words appends n words drawn from r to b, separated by single spaces, with a leading space when
// b is not empty. Cost: O(n), no allocation beyond b's growth.
func words(b *strings.Builder, r *rand.Rand, n int) {
	for i := 0; i < n; i++ {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocabulary[r.IntN(len(vocabulary))])
	}
}

// seeded returns a PRNG fully determined by the pair (a, b).
func seeded(a, b uint64) *rand.Rand {
	return rand.New(rand.NewPCG(a, b))
}

// Stream salts keep the PRNG streams of different purposes apart under one seed.
const (
	saltMooncakeBlock = 0x6d6f6f6e63616b65
	saltRandomText    = 0x72616e646f6d7478
	saltSystemPrompt  = 0x73797374656d7072
	saltQuestion      = 0x7175657374696f6e
	saltShuffle       = 0x73687566666c6521
	saltArrivals      = 0x6172726976616c73
	saltLengths       = 0x6c656e6774687321
)
