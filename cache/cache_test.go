package cache

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/subjects"
)

// writeFile writes data at path and returns it.
func writeFile(t *testing.T, path string, data []byte) string {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func sum(t *testing.T, h *Hasher, path string) FileSum {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fs, err := h.SumFile(f, path, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// TestRewriteSameSizeAndMtimeIsHashedAgain: a file rewritten in place with other bytes of
// the same size, its mtime set back, keeps path, size, mtime and inode; its ctime moves,
// so its stat key differs and it is hashed again: a new content hash, never the old one.
func TestRewriteSameSizeAndMtimeIsHashedAgain(t *testing.T) {
	h := NewHasher(16)
	h.Racy = 0 // the stat key alone decides here (the racy rule is TestRacyFileIsHashedAgain's)
	p := writeFile(t, filepath.Join(t.TempDir(), "a.png"), bytes.Repeat([]byte("A"), 4096))
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	first := sum(t, h, p)
	if again := sum(t, h, p); again.Sum != first.Sum || h.Stats().Hashed != 1 {
		t.Fatalf("an unchanged file was hashed again (%d hashes) or hashed otherwise", h.Stats().Hashed)
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0) // in place: the same inode
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte("B"), 4096), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	second := sum(t, h, p)
	if second.Stat.Size != first.Stat.Size || second.Stat.Mtime != first.Stat.Mtime || second.Stat.Ino != first.Stat.Ino {
		t.Fatalf("the rewrite was meant to keep size, mtime and inode: %+v then %+v", first.Stat, second.Stat)
	}
	if second.Sum == first.Sum {
		t.Fatal("a file rewritten with the same size and mtime was given its old content hash")
	}
	if h.Stats().Hashed != 2 {
		t.Fatalf("%d hashes, want 2", h.Stats().Hashed)
	}
	if h.Unchanged(first) {
		t.Fatal("Unchanged says yes for the old version")
	}
	if !h.Unchanged(second) {
		t.Fatal("Unchanged says no for the file as it is")
	}
}

// TestRacyFileIsHashedAgain: a file hashed within Racy of its last change is hashed again
// each time (its timestamps could hide a change within the filesystem's granularity).
func TestRacyFileIsHashedAgain(t *testing.T) {
	h := NewHasher(16)
	h.Racy = time.Hour
	p := writeFile(t, filepath.Join(t.TempDir(), "a.png"), []byte("hello"))
	sum(t, h, p)
	sum(t, h, p)
	if n := h.Stats().Hashed; n != 2 {
		t.Fatalf("%d hashes of a racy file, want 2", n)
	}
}

// TestHasherBounds: past its bound the least recently used file is forgotten; a file over
// the limit is refused.
func TestHasherBounds(t *testing.T) {
	h := NewHasher(2)
	h.Racy = 0
	dir := t.TempDir()
	var ps []string
	for i := range 3 {
		ps = append(ps, writeFile(t, filepath.Join(dir, fmt.Sprint(i)), []byte{byte(i)}))
	}
	for _, p := range ps {
		sum(t, h, p)
	}
	if len(h.m) != 2 || h.ll.Len() != 2 {
		t.Fatalf("%d remembered, want 2", len(h.m))
	}
	sum(t, h, ps[0]) // forgotten: hashed again
	if n := h.Stats().Hashed; n != 4 {
		t.Fatalf("%d hashes, want 4", n)
	}
	big := writeFile(t, filepath.Join(dir, "big"), make([]byte, 100))
	f, _ := os.Open(big)
	defer f.Close()
	if _, err := h.SumFile(f, big, 99); err != ErrTooLarge {
		t.Fatalf("over the limit: %v, want ErrTooLarge", err)
	}
}

// TestRevision: a model's revision follows its files' bytes and its settings.
func TestRevision(t *testing.T) {
	h := NewHasher(16)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "model.onnx"), []byte("weights 1"))
	writeFile(t, filepath.Join(dir, "selected_tags.csv"), []byte("tags"))
	m := &config.Model{Name: "t", Kind: config.KindTaggerWD14, Dir: dir}
	r1, err := Revision(h, m)
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := Revision(h, m); r != r1 {
		t.Fatal("the revision of unchanged files changed")
	}
	m2 := *m
	m2.General = 0.5
	if r, _ := Revision(h, &m2); r == r1 {
		t.Fatal("a threshold setting did not change the revision")
	}
	writeFile(t, filepath.Join(dir, "model.onnx"), []byte("weights 2"))
	if r, _ := Revision(h, m); r == r1 {
		t.Fatal("new weights did not change the revision")
	}
	if _, err := Revision(h, &config.Model{Name: "x", Kind: config.KindTaggerWD14, Dir: t.TempDir()}); err == nil {
		t.Fatal("a model without files has a revision")
	}
}

// TestKey: every part of the key changes the digest and the subject; the filters match
// what they should.
func TestKey(t *testing.T) {
	g := 0.5
	base := Key{Owner: "", Op: "tag", Model: "m", Revision: "r", Content: [32]byte{1}}
	seen := map[string]string{base.Digest(): "base"}
	for name, k := range map[string]Key{
		"owner":    {Owner: "account:A", Op: "tag", Model: "m", Revision: "r", Content: [32]byte{1}},
		"op":       {Op: "embed", Model: "m", Revision: "r", Content: [32]byte{1}},
		"model":    {Op: "tag", Model: "m2", Revision: "r", Content: [32]byte{1}},
		"revision": {Op: "tag", Model: "m", Revision: "r2", Content: [32]byte{1}},
		"content":  {Op: "tag", Model: "m", Revision: "r", Content: [32]byte{2}},
		"options":  {Op: "tag", Model: "m", Revision: "r", Content: [32]byte{1}, Options: OptionsOf("tag", &codec.Request{Thresholds: &codec.Thresholds{General: &g}})},
	} {
		if other, dup := seen[k.Digest()]; dup {
			t.Errorf("%s gives the digest of %s", name, other)
		}
		seen[k.Digest()] = name
	}
	if a, b := OptionsOf("tag", &codec.Request{}), OptionsOf("tag", &codec.Request{Conf: &g}); !bytes.Equal(a, b) {
		t.Error("conf changed a tag key")
	}
	if OptionsOf("embed", &codec.Request{Conf: &g}) != nil {
		t.Error("embed has options")
	}
	subj := base.Subject()
	if !strings.HasPrefix(subj, subjects.CachePrefix+"."+ModelToken("m")+"."+RevisionToken("r")+"."+OwnerToken("")+".") {
		t.Errorf("subject %s", subj)
	}
}

// TestEntryDecode: a truncated, altered or foreign entry is refused.
func TestEntryDecode(t *testing.T) {
	b, err := encodeEntry("k1", 1, []byte("reply"))
	if err != nil {
		t.Fatal(err)
	}
	if e, err := decodeEntry(b, "k1"); err != nil || string(e.Body) != "reply" {
		t.Fatalf("a good entry: %v", err)
	}
	for name, data := range map[string][]byte{
		"truncated": b[:len(b)-3],
		"empty":     nil,
		"garbage":   []byte("\xc1\xff not msgpack"),
	} {
		if _, err := decodeEntry(data, "k1"); err == nil {
			t.Errorf("%s entry decoded", name)
		}
	}
	if _, err := decodeEntry(b, "k2"); err == nil {
		t.Error("another key's entry decoded")
	}
	flipped := bytes.Clone(b)
	i := bytes.Index(flipped, []byte("reply"))
	flipped[i] ^= 1
	if _, err := decodeEntry(flipped, "k1"); err == nil {
		t.Error("an altered entry decoded")
	}
}

// TestFlights: one leader per key; the others get its answer, or lead the next try when
// it had none.
func TestFlights(t *testing.T) {
	var fs Flights
	f, leader := fs.Join("k")
	if !leader {
		t.Fatal("the first is not the leader")
	}
	var wg sync.WaitGroup
	got := make([][]byte, 4)
	for i := range got {
		w, lead := fs.Join("k")
		if lead {
			t.Fatal("a second leader")
		}
		wg.Add(1)
		go func() { defer wg.Done(); got[i] = w.Wait(context.Background()) }()
	}
	fs.Finish("k", f, []byte("answer"))
	wg.Wait()
	for i, b := range got {
		if string(b) != "answer" {
			t.Errorf("waiter %d got %q", i, b)
		}
	}
	if fs.Len() != 0 {
		t.Fatal("a finished flight stays")
	}
	f, _ = fs.Join("k")
	w, _ := fs.Join("k")
	fs.Finish("k", f, nil)
	if w.Wait(context.Background()) != nil {
		t.Fatal("a failed leader shared an answer")
	}
}

func openStore(t *testing.T, nc *nats.Conn, maxBytes config.Bytes) *Store {
	t.Helper()
	s, err := Open(context.Background(), nc, config.Cache{Enabled: true, MaxBytes: maxBytes, Replicas: 1},
		slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func key(i int, owner, model string) Key {
	return Key{Owner: owner, Op: "tag", Model: model, Revision: "r1", Content: [32]byte{byte(i), byte(i >> 8)}}
}

// TestStoreGetPut: an answer stored is read back; another owner's key misses; entries
// older than since miss; a corrupt or truncated entry is a miss (counted), never an error.
func TestStoreGetPut(t *testing.T) {
	nc := testenv.InProcessJetStream(t)
	s := openStore(t, nc, 1<<20)
	ctx := context.Background()
	k := key(1, "", "m")
	if _, ok := s.Get(ctx, k, time.Time{}); ok {
		t.Fatal("a hit in an empty cache")
	}
	if err := s.Put(ctx, k, []byte("reply one")); err != nil {
		t.Fatal(err)
	}
	if b, ok := s.Get(ctx, k, time.Time{}); !ok || string(b) != "reply one" {
		t.Fatalf("get: %q %v", b, ok)
	}
	if _, ok := s.Get(ctx, key(1, "account:B", "m"), time.Time{}); ok {
		t.Fatal("another owner's key hit")
	}
	if _, ok := s.Get(ctx, k, time.Now().Add(time.Hour)); ok {
		t.Fatal("an entry older than since hit")
	}
	// Corrupt entries, written straight to the stream.
	for i, data := range [][]byte{[]byte("garbage"), nil} {
		ck := key(100+i, "", "m")
		good, _ := encodeEntry(ck.Digest(), time.Now().UnixMilli(), []byte("the reply"))
		if data == nil {
			data = good[:len(good)/2] // truncated
		}
		if _, err := nc.Request(ck.Subject(), data, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if _, ok := s.Get(ctx, ck, time.Time{}); ok {
			t.Fatalf("corrupt entry %d hit", i)
		}
	}
	c := s.Counters()
	if c.Hits != 1 || c.Corrupt != 2 || c.Writes != 1 {
		t.Fatalf("counters %+v, want 1 hit, 2 corrupt, 1 write", c)
	}
}

// TestStoreEvictsAndKeepsServing: with far more answers than max_bytes holds, every write
// is taken (the oldest entries evicted), the latest answers are served, and evictions are
// counted; purges by model and owner remove just those entries.
func TestStoreEvictsAndKeepsServing(t *testing.T) {
	nc := testenv.InProcessJetStream(t)
	s := openStore(t, nc, 64<<10)
	ctx := context.Background()
	body := bytes.Repeat([]byte("x"), 900)
	const n = 300 // ~300 KB of entries into 64 KiB
	for i := range n {
		if err := s.Put(ctx, key(i, "", "m"), body); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	c := s.Counters()
	if c.Evictions == 0 || c.Writes != n {
		t.Fatalf("counters %+v: want %d writes and some evictions", c, n)
	}
	if _, b, err := s.Usage(ctx); err != nil || b > 64<<10 {
		t.Fatalf("usage %d bytes (%v), over the bound", b, err)
	}
	if _, ok := s.Get(ctx, key(n-1, "", "m"), time.Time{}); !ok {
		t.Fatal("the latest answer is not served")
	}
	if _, ok := s.Get(ctx, key(0, "", "m"), time.Time{}); ok {
		t.Fatal("the oldest answer survived eviction")
	}
	// Purges: by model and owner.
	for _, k := range []Key{key(1, "", "a"), key(2, "", "b"), key(3, "account:T", "a")} {
		if err := s.Put(ctx, k, body); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.Count(ctx, Filter("a", "", true)); err != nil || n != 2 {
		t.Fatalf("count of model a: %d %v, want 2", n, err)
	}
	if n, err := s.Count(ctx, Filter("", "account:T", false)); err != nil || n != 1 {
		t.Fatalf("count of owner T: %d %v, want 1", n, err)
	}
	if _, err := s.Purge(ctx, Filter("a", "account:T", false)); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Get(ctx, key(3, "account:T", "a"), time.Time{}); ok {
		t.Fatal("a purged entry hit")
	}
	if _, ok := s.Get(ctx, key(1, "", "a"), time.Time{}); !ok {
		t.Fatal("an owner's purge removed another owner's entry")
	}
	if _, err := s.Purge(ctx, Filter("a", "", true)); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Get(ctx, key(1, "", "a"), time.Time{}); ok {
		t.Fatal("model a's entry survived its purge")
	}
	if _, ok := s.Get(ctx, key(2, "", "b"), time.Time{}); !ok {
		t.Fatal("model a's purge removed model b's entry")
	}
}
