package routing

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// treePut inserts prompt for worker id at time now in the global scope, as Pick does after
// choosing.
func treePut(tr *radixTree, id, prompt string, now int64) {
	treePutIn(tr, "", id, prompt, now)
}

// treePutIn is treePut in the scope named namespace.
func treePutIn(tr *radixTree, namespace, id, prompt string, now int64) {
	tr.insert(prompt, tr.descend(tr.scopeRoot(namespace, true), prompt), tr.slot(id), now)
}

// anonymous is the cache scope of the tests' requests, which name no tenant.
var anonymous = CacheScopeTenant.namespace(&Request{})

// treeRoots returns the global root and every scope's root, the scopes' in order of namespace.
func treeRoots(tr *radixTree) []*node {
	roots := []*node{&tr.root}
	for _, ns := range slices.Sorted(maps.Keys(tr.scopes)) {
		roots = append(roots, tr.scopes[ns])
	}
	return roots
}

// treeHoldings returns, for every worker holding a prefix of prompt in any cache scope, the length
// of the longest one.
func treeHoldings(tr *radixTree, prompt string) map[string]int {
	got := map[string]int{}
	for _, root := range treeRoots(tr) {
		for id, n := range scopeHoldings(tr, root, prompt) {
			got[id] = max(got[id], n)
		}
	}
	return got
}

// scopeHoldings is treeHoldings within the scope whose root is root.
func scopeHoldings(tr *radixTree, root *node, prompt string) map[string]int {
	d := tr.descend(root, prompt)
	got := map[string]int{}
	add := func(n *node, depth int) {
		for _, s := range n.slots {
			id := tr.workers[s].id
			if _, seen := got[id]; !seen {
				got[id] = depth
			}
		}
	}
	if d.child != nil {
		add(d.child, d.matched())
	}
	for n := d.n; n.parent != nil; n = n.parent {
		add(n, n.end)
	}
	return got
}

// treeEdges lists the tree as "prefix|label[holders]" lines in depth-first order of sorted labels,
// the global scope's first, then each other scope's.
func treeEdges(tr *radixTree) []string {
	var out []string
	var walk func(n *node, prefix string)
	walk = func(n *node, prefix string) {
		kids := slices.Clone(n.children)
		slices.SortFunc(kids, func(a, b *node) int { return strings.Compare(a.label, b.label) })
		for _, c := range kids {
			ids := make([]string, 0, len(c.slots))
			for _, s := range c.slots {
				ids = append(ids, tr.workers[s].id)
			}
			slices.Sort(ids)
			out = append(out, fmt.Sprintf("%s|%s%v", prefix, c.label, ids))
			walk(c, prefix+c.label)
		}
	}
	for _, root := range treeRoots(tr) {
		walk(root, "")
	}
	return out
}

// treeLRU lists the prefixes worker id holds, least recent first.
func treeLRU(tr *radixTree, id string) []string {
	w := tr.workers[tr.slots[id]]
	var out []string
	for h := w.lru.prev; h != &w.lru; h = h.prev {
		var parts []string
		for n := h.node; n.parent != nil; n = n.parent {
			parts = append(parts, n.label)
		}
		slices.Reverse(parts)
		out = append(out, strings.Join(parts, ""))
	}
	return out
}

// checkTree fails t unless every invariant of radixTree holds.
func checkTree(t *testing.T, tr *radixTree) {
	t.Helper()
	nodes, labels := 0, int64(0)
	bytesOf := map[int32]int64{}
	var walk func(n *node)
	walk = func(n *node) {
		if len(n.keys) != len(n.children) {
			t.Fatalf("node %q: %d keys, %d children", n.label, len(n.keys), len(n.children))
		}
		for i, c := range n.children {
			nodes++
			labels += int64(len(c.label))
			switch {
			case c.label == "":
				t.Fatalf("empty label under %q", n.label)
			case c.label[0] != n.keys[i]:
				t.Fatalf("child %q under key %q", c.label, n.keys[i])
			case c.parent != n:
				t.Fatalf("child %q: wrong parent", c.label)
			case c.end != n.end+len(c.label):
				t.Fatalf("child %q: end %d, want %d", c.label, c.end, n.end+len(c.label))
			case len(c.holders) == 0 || len(c.holders) != len(c.slots):
				t.Fatalf("child %q: %d holders, %d slots", c.label, len(c.holders), len(c.slots))
			}
			for j, h := range c.holders {
				if h.node != c || h.slot != c.slots[j] {
					t.Fatalf("child %q: holder %d points elsewhere", c.label, j)
				}
				if n.parent != nil && !slices.Contains(n.slots, h.slot) {
					t.Fatalf("child %q held by slot %d, its parent %q is not", c.label, h.slot, n.label)
				}
				bytesOf[h.slot] += int64(len(c.label))
			}
			walk(c)
		}
	}
	for ns, root := range tr.scopes {
		if root.label != ns || root.parent != nil || len(root.children) == 0 {
			t.Fatalf("scope %q: root labelled %q, %d children", ns, root.label, len(root.children))
		}
	}
	if len(tr.none.children) != 0 {
		t.Fatalf("the empty root has %d children", len(tr.none.children))
	}
	for _, root := range treeRoots(tr) {
		walk(root)
	}
	if nodes != tr.nodes || labels != tr.labels {
		t.Fatalf("counted %d nodes of %d bytes, tree says %d of %d", nodes, labels, tr.nodes, tr.labels)
	}
	for s, w := range tr.workers {
		if w == nil {
			continue
		}
		if w.bytes != bytesOf[int32(s)] {
			t.Fatalf("worker %s: %d bytes, counted %d", w.id, w.bytes, bytesOf[int32(s)])
		}
		seen := map[*node]bool{}
		for h := w.lru.prev; h != &w.lru; h = h.prev {
			for a := h.node.parent; a.parent != nil; a = a.parent {
				if seen[a] {
					t.Fatalf("worker %s: ancestor %q less recent than descendant %q", w.id, a.label, h.node.label)
				}
			}
			seen[h.node] = true
		}
	}
}

func TestRadixInsertSplitMatch(t *testing.T) {
	type ins struct{ worker, prompt string }
	tests := []struct {
		name  string
		puts  []ins
		edges []string
		query string
		want  map[string]int
	}{
		{
			name:  "empty tree",
			query: "hello",
			want:  map[string]int{},
		},
		{
			name:  "one prompt, exact match",
			puts:  []ins{{"a", "hello world"}},
			edges: []string{"|hello world[a]"},
			query: "hello world",
			want:  map[string]int{"a": 11},
		},
		{
			name:  "query longer than the tree",
			puts:  []ins{{"a", "hello"}},
			edges: []string{"|hello[a]"},
			query: "hello world",
			want:  map[string]int{"a": 5},
		},
		{
			name:  "query ends inside an edge",
			puts:  []ins{{"a", "hello world"}},
			edges: []string{"|hello world[a]"},
			query: "hello",
			want:  map[string]int{"a": 5},
		},
		{
			name:  "query diverges inside an edge",
			puts:  []ins{{"a", "hello world"}},
			query: "help me",
			want:  map[string]int{"a": 3},
		},
		{
			name:  "no common first byte",
			puts:  []ins{{"a", "hello"}},
			query: "world",
			want:  map[string]int{},
		},
		{
			name:  "divergence splits the edge",
			puts:  []ins{{"a", "hello world"}, {"a", "hello there"}},
			edges: []string{"|hello [a]", "hello |there[a]", "hello |world[a]"},
			query: "hello there!",
			want:  map[string]int{"a": 11},
		},
		{
			name:  "a shorter prompt splits without a new leaf",
			puts:  []ins{{"a", "hello world"}, {"b", "hello"}},
			edges: []string{"|hello[a b]", "hello| world[a]"},
			query: "hello world",
			want:  map[string]int{"a": 11, "b": 5},
		},
		{
			name:  "a longer prompt extends a leaf",
			puts:  []ins{{"a", "hello"}, {"b", "hello world"}},
			edges: []string{"|hello[a b]", "hello| world[b]"},
			query: "hello world",
			want:  map[string]int{"a": 5, "b": 11},
		},
		{
			name: "two workers share the system prompt",
			puts: []ins{
				{"a", "You are helpful. Q1"},
				{"b", "You are helpful. Q2"},
				{"b", "You are terse. Q3"},
			},
			edges: []string{
				"|You are [a b]",
				"You are |helpful. Q[a b]",
				"You are helpful. Q|1[a]",
				"You are helpful. Q|2[b]",
				"You are |terse. Q3[b]",
			},
			query: "You are helpful. Q1 and more",
			want:  map[string]int{"a": 19, "b": 18},
		},
		{
			name:  "the same prompt twice changes nothing",
			puts:  []ins{{"a", "abc"}, {"a", "abc"}},
			edges: []string{"|abc[a]"},
			query: "abc",
			want:  map[string]int{"a": 3},
		},
		{
			name:  "empty prompt holds nothing",
			puts:  []ins{{"a", ""}},
			query: "abc",
			want:  map[string]int{},
		},
		{
			name:  "multi-byte runes are bytes",
			puts:  []ins{{"a", "héllo"}, {"b", "hèllo"}},
			edges: []string{"|h\xc3[a b]", "h\xc3|\xa8llo[b]", "h\xc3|\xa9llo[a]"},
			query: "héllo",
			want:  map[string]int{"a": 6, "b": 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newRadixTree()
			for i, p := range tt.puts {
				treePut(tr, p.worker, p.prompt, int64(i))
				checkTree(t, tr)
			}
			if tt.edges != nil {
				if got := treeEdges(tr); !slices.Equal(got, tt.edges) {
					t.Errorf("edges: got %q, want %q", got, tt.edges)
				}
			}
			if got := treeHoldings(tr, tt.query); !maps.Equal(got, tt.want) {
				t.Errorf("holdings of %q: got %v, want %v", tt.query, got, tt.want)
			}
		})
	}
}

func TestRadixCommonPrefix(t *testing.T) {
	long := strings.Repeat("0123456789abcdef", 20)
	huge := strings.Repeat("0123456789abcdef", 250)
	tests := []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"abc", "", 0},
		{"abc", "abd", 2},
		{"abc", "abcdef", 3},
		{long, long, len(long)},
		{long, long[:100], 100},
		{long, long[:63] + "!", 63},
		{long, long[:64] + "!", 64},
		{long, long[:200] + "!", 200},
		{long, long[:71] + "!", 71},
		{huge, huge, len(huge)},
		{huge, huge[:255] + "!", 255},
		{huge, huge[:256] + "!", 256},
		{huge, huge[:257] + "!", 257},
		{huge, huge[:1000] + "!" + huge[1001:], 1000},
		{huge, huge[:len(huge)-1] + "!", len(huge) - 1},
	}
	for _, tt := range tests {
		if got := commonPrefix(tt.a, tt.b); got != tt.want {
			t.Errorf("commonPrefix(%d bytes, %d bytes): got %d, want %d", len(tt.a), len(tt.b), got, tt.want)
		}
	}
}

func TestRadixLRUOrderAndEviction(t *testing.T) {
	tr := newRadixTree()
	treePut(tr, "a", "sys: one", 1)
	treePut(tr, "a", "sys: two", 2)
	treePut(tr, "a", "other", 3)
	treePut(tr, "a", "sys: one", 4) // "sys: one" is fresh again; "sys: two" is now the oldest
	checkTree(t, tr)
	want := []string{"sys: two", "other", "sys: one", "sys: "}
	if got := treeLRU(tr, "a"); !slices.Equal(got, want) {
		t.Fatalf("LRU order: got %q, want %q", got, want)
	}

	tests := []struct {
		target    int64
		wantEdges []string
	}{
		{target: 100, wantEdges: []string{"|other[a]", "|sys: [a]", "sys: |one[a]", "sys: |two[a]"}},
		{target: 15, wantEdges: []string{"|other[a]", "|sys: [a]", "sys: |one[a]"}}, // drops "two" (3)
		{target: 10, wantEdges: []string{"|sys: [a]", "sys: |one[a]"}},              // then "other" (5)
		{target: 5, wantEdges: []string{"|sys: [a]"}},                               // then "one"
		{target: 0, wantEdges: nil},                                                 // and the root edge last
	}
	for _, tt := range tests {
		tr.evict(tr.slot("a"), tt.target, 1000)
		checkTree(t, tr)
		if got := treeEdges(tr); !slices.Equal(got, tt.wantEdges) {
			t.Errorf("evict to %d: got %q, want %q", tt.target, got, tt.wantEdges)
		}
		if got := tr.workers[tr.slot("a")].bytes; got > tt.target {
			t.Errorf("evict to %d: got %d bytes held", tt.target, got)
		}
	}
}

func TestRadixEvictionKeepsOtherHolders(t *testing.T) {
	tr := newRadixTree()
	treePut(tr, "a", "shared prefix, a's question", 1)
	treePut(tr, "b", "shared prefix, b's question", 2)
	tr.evict(tr.slot("a"), 0, 1000)
	checkTree(t, tr)
	if got, want := treeHoldings(tr, "shared prefix, b's question"), map[string]int{"b": 27}; !maps.Equal(got, want) {
		t.Errorf("after evicting a: got %v, want %v", got, want)
	}
	if got := tr.evict(tr.slot("b"), 0, 1); got != 1 {
		t.Errorf("evict with limit 1: released %d, want 1", got)
	}
	if got, want := treeEdges(tr), []string{"|shared prefix, [b]"}; !slices.Equal(got, want) {
		t.Errorf("after one release of b: got %q, want %q", got, want)
	}
}

func TestRadixRemoveWorker(t *testing.T) {
	tr := newRadixTree()
	treePut(tr, "a", "common start then a", 1)
	treePut(tr, "b", "common start then b", 2)
	treePut(tr, "a", "only a", 3)
	tr.remove("a")
	checkTree(t, tr)
	if got, want := treeEdges(tr), []string{"|common start then [b]", "common start then |b[b]"}; !slices.Equal(got, want) {
		t.Errorf("edges: got %q, want %q", got, want)
	}
	if _, ok := tr.slots["a"]; ok {
		t.Errorf("worker a still has a slot")
	}
	tr.remove("a") // removing twice is harmless
	gen := tr.gen
	treePut(tr, "c", "only c", 4) // c reuses a's slot
	if got, want := tr.slot("c"), int32(0); got != want {
		t.Errorf("slot of c: got %d, want %d (a's, released)", got, want)
	}
	if got, want := treeHoldings(tr, "only c"), map[string]int{"c": 6}; !maps.Equal(got, want) {
		t.Errorf("holdings: got %v, want %v", got, want)
	}
	if tr.gen != gen {
		t.Errorf("gen moved on a registration: got %d, want %d", tr.gen, gen)
	}
	tr.remove("b")
	tr.remove("c")
	checkTree(t, tr)
	if tr.nodes != 0 || tr.labels != 0 || len(tr.root.children) != 0 {
		t.Errorf("empty tree: got %d nodes, %d bytes, %d root children", tr.nodes, tr.labels, len(tr.root.children))
	}
}

// TestRadixRandomised checks the invariants after a long random mix of inserts, evictions and
// removals over prompts that share prefixes at many depths.
func TestRadixRandomised(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	words := []string{"a", "b", "ab", "ba", " ", "abc"}
	prompt := func() string {
		var sb strings.Builder
		for range rnd.IntN(12) {
			sb.WriteString(words[rnd.IntN(len(words))])
		}
		return sb.String()
	}
	ids := []string{"w0", "w1", "w2", "w3"}
	tr := newRadixTree()
	for i := range 3000 {
		id := ids[rnd.IntN(len(ids))]
		switch r := rnd.IntN(100); {
		case r < 80:
			p := prompt()
			treePut(tr, id, p, int64(i))
			if got := treeHoldings(tr, p)[id]; got != len(p) {
				t.Fatalf("step %d: %s holds %d bytes of %q, want all", i, id, got, p)
			}
		case r < 97:
			tr.evict(tr.slot(id), int64(rnd.IntN(40)), 1+rnd.IntN(5))
		default:
			tr.remove(id)
		}
		checkTree(t, tr)
	}
}

// TestRadixMatchesModel compares the tree with a plain list of the prompts each worker was given:
// without eviction, a worker's match of a query is its longest common prefix with any of them.
func TestRadixMatchesModel(t *testing.T) {
	rnd := rand.New(rand.NewPCG(5, 6))
	prompt := func() string {
		b := make([]byte, rnd.IntN(16))
		for i := range b {
			b[i] = "abc"[rnd.IntN(3)]
		}
		return string(b)
	}
	ids := []string{"w0", "w1", "w2"}
	model := map[string][]string{}
	tr := newRadixTree()
	for step := range 2000 {
		id := ids[rnd.IntN(len(ids))]
		if rnd.IntN(50) == 0 {
			tr.remove(id)
			delete(model, id)
		} else {
			p := prompt()
			treePut(tr, id, p, int64(step))
			model[id] = append(model[id], p)
		}
		q := prompt()
		want := map[string]int{}
		for id, ps := range model {
			for _, p := range ps {
				if n := commonPrefix(p, q); n > 0 && n > want[id] {
					want[id] = n
				}
			}
		}
		if got := treeHoldings(tr, q); !maps.Equal(got, want) {
			t.Fatalf("step %d, query %q: got %v, want %v", step, q, got, want)
		}
	}
	checkTree(t, tr)
}

func TestRadixHorizonAndHeldBy(t *testing.T) {
	tr := newRadixTree()
	treePut(tr, "w", "aaaa", 1)
	treePut(tr, "w", "aaaabbbb", 2) // "bbbb" is a new node under "aaaa", both accessed at 2
	treePut(tr, "w", "cccc", 3)
	s := tr.slots["w"]
	// The LRU list, most recent first: cccc (3), aaaa (2), bbbb (2).
	for _, tt := range []struct{ limit, want int64 }{
		{100, 0}, // everything within the limit
		{12, 0},  // exactly all 12 bytes
		{11, 3},  // bbbb is past it, and with it all of its insert: aaaa too
		{4, 3},   // only cccc
		{3, 4},   // not even the latest insert
	} {
		if got := tr.horizon(s, tt.limit); got != tt.want {
			t.Errorf("horizon(limit %d): got %d, want %d", tt.limit, got, tt.want)
		}
	}
	d := tr.descend(&tr.root, "aaaabbbbzz")
	for _, tt := range []struct {
		horizon  int64
		held     int
		wantLast int64
	}{{0, 8, 2}, {2, 8, 2}, {3, 0, 0}} {
		if held, last := tr.heldBy(d, s, tt.horizon); held != tt.held || last != tt.wantLast {
			t.Errorf("heldBy(horizon %d): got %d bytes, last %d; want %d, %d", tt.horizon, held, last, tt.held, tt.wantLast)
		}
	}
	if got := tr.bytesSince(s, 1); got != 12 {
		t.Errorf("bytesSince(1): got %d, want 12", got)
	}
	if got := tr.bytesSince(s, 2); got != 4 {
		t.Errorf("bytesSince(2): got %d, want 4", got)
	}
}
