package sim

import (
	"math/rand/v2"
	"strings"
)

// A token is a whitespace-separated word; its id is the word's 64-bit FNV-1a hash, so equal
// words are equal tokens in every process and block hashes are repeatable across runs.

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func tokenID(word string) uint64 {
	h := uint64(fnvOffset)
	for i := 0; i < len(word); i++ {
		h ^= uint64(word[i])
		h *= fnvPrime
	}
	return h
}

// tokenize splits text into tokens and returns their ids.
func tokenize(text string) []uint64 {
	words := strings.Fields(text)
	ids := make([]uint64, len(words))
	for i, w := range words {
		ids[i] = tokenID(w)
	}
	return ids
}

// mix folds v into the running hash h (a 64-bit finalizer, so every input bit spreads).
func mix(h, v uint64) uint64 {
	h ^= v + 0x9e3779b97f4a7c15 + (h << 6) + (h >> 2)
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return h
}

// saltHash is what a cache_salt contributes to the hash of a prompt's first block, as vLLM mixes
// the salt into that block's extra keys: never 0, the unsalted prompts' parent.
func saltHash(salt string) uint64 {
	h := uint64(0x5a17)
	for _, c := range []byte(salt) {
		h = mix(h, uint64(c))
	}
	return h | 1
}

// blockHash is the chained hash of one full block: it covers the parent block's hash and the
// block's token ids, so equal hashes mean equal whole prefixes.
func blockHash(parent uint64, ids []uint64) uint64 {
	h := mix(parent, uint64(len(ids)))
	for _, id := range ids {
		h = mix(h, id)
	}
	return h
}

// chatMessage is one message of a chat request; content is a string or a list of text parts.
type chatMessage struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
}

// renderChat renders messages as the engine's chat template: "<|role|> content" per message,
// joined by spaces, then "<|assistant|>" as the generation prompt. A later turn of a
// conversation (earlier messages, the assistant's reply, a new user message) therefore starts
// with exactly the tokens of the earlier turn's prompt and output.
func renderChat(msgs []chatMessage) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|> ")
		switch c := m.Content.(type) {
		case string:
			b.WriteString(c)
		case []any:
			for _, part := range c {
				if p, ok := part.(map[string]any); ok {
					if text, ok := p["text"].(string); ok {
						b.WriteString(text)
						b.WriteByte(' ')
					}
				}
			}
		}
		b.WriteByte(' ')
	}
	b.WriteString(chatGenerationPrompt)
	return b.String()
}

// chatGenerationPrompt ends a rendered chat: the turn the engine answers.
const chatGenerationPrompt = "<|assistant|>"

// vocabulary is the filler the engine generates from. Each generated token is one of these.
var vocabulary = strings.Fields(`the a of and to in is it that was for on are as with his they at
be this from have or by one had not but what all were when we there can an your which their
said if do will each about how up out them then she many some so these would other into has
more her two like him see time could no make than first been its who now people my made over
did down only way find use may water long little very after words called just where most know
get through back much before go good new write our used me man too any day same right look
think also around another came come work three word must because does part even place well
such here take why things help put years different away again off went old number great tell
men say small every found still between name should home big give air line set own under read
last never us left end along while might next sound below saw something thought both few those
always looked show large often together asked house world going want school important until
form food keep children feet land side without boy once animals life enough took sometimes
four head above kind began almost live page got earth need far hand high year mother light
parts country father let night following picture being study second eyes soon times story
boys since white days ever paper hard near sentence better best across during today others
however sure means knew try told young miles sun ways thing whole hear example heard
several change answer room sea against top turned learn point city play toward five using
himself usually`)

var vocabularyIDs = func() []uint64 {
	ids := make([]uint64, len(vocabulary))
	for i, w := range vocabulary {
		ids[i] = tokenID(w)
	}
	return ids
}()

// newFiller returns the generator of a sequence's output: seeded from the prompt's tokens, so
// the same prompt always yields the same words.
func newFiller(prompt []uint64) *rand.Rand {
	seed := uint64(fnvOffset)
	for _, id := range prompt {
		seed = mix(seed, id)
	}
	return rand.New(rand.NewPCG(seed, seed^0x6a09e667f3bcc909))
}
