package cache

import (
	"container/list"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/models/modelrev"
)

// StatKey is what a file's stat says of its version: when any of it differs, the file
// is hashed again.
type StatKey struct {
	Size         int64
	Mtime, Ctime int64 // Unix ns
	Ino, Dev     uint64
}

// statKeyOf reads the stat key from fi (Linux and the other Unixes: syscall.Stat_t).
func statKeyOf(fi os.FileInfo) StatKey {
	k := StatKey{Size: fi.Size(), Mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		k.Ino, k.Dev = uint64(st.Ino), uint64(st.Dev)
		k.Ctime = ctimeOf(st)
	}
	return k
}

// FileSum is a file's content hash and the stat key it was taken under.
type FileSum struct {
	Path string // the path hashed (resolved: no symlink left)
	Sum  [32]byte
	Stat StatKey
}

// Errors of SumFile: the file is over the size limit, or changed while it was hashed.
// Either way the caller does without the cache for it.
var (
	ErrTooLarge = errors.New("cache: file over the size limit")
	ErrChanged  = errors.New("cache: file changed while it was hashed")
)

// DefaultRacy is Hasher.Racy's default.
const DefaultRacy = 2 * time.Second

// Hasher hashes files, each version once: it remembers the content hash of up to max
// paths under their stat keys (least recently used forgotten first). Safe for
// concurrent use.
type Hasher struct {
	// Racy: a stat key is trusted only when the file was hashed more than this after its
	// mtime and ctime (the package doc's rule).
	Racy time.Duration

	mu  sync.Mutex
	max int
	ll  *list.List
	m   map[string]*list.Element

	stats, hashed, statNS, hashNS, hashBytes atomic.Uint64
}

type memo struct {
	path string
	key  StatKey
	sum  [32]byte
	at   time.Time // when the stat key was read, before the bytes were
}

// NewHasher remembers at most entries files (at least 1).
func NewHasher(entries int) *Hasher {
	return &Hasher{Racy: DefaultRacy, max: max(1, entries), ll: list.New(), m: map[string]*list.Element{}}
}

// HashStats are a Hasher's counters: files stat'ed, files hashed, the time each took and
// the bytes hashed.
type HashStats struct {
	Stats, Hashed  uint64
	StatNS, HashNS uint64
	HashBytes      uint64
}

// Stats reads the counters.
func (h *Hasher) Stats() HashStats {
	return HashStats{Stats: h.stats.Load(), Hashed: h.hashed.Load(), StatNS: h.statNS.Load(), HashNS: h.hashNS.Load(), HashBytes: h.hashBytes.Load()}
}

// trusted reports whether m's stat key may stand for its content hash: the file was
// hashed more than Racy after its last change.
func (h *Hasher) trusted(m *memo) bool {
	last := time.Unix(0, max(m.key.Mtime, m.key.Ctime))
	return m.at.Sub(last) > h.Racy
}

func (h *Hasher) recall(path string, key StatKey) (sum [32]byte, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e, found := h.m[path]
	if !found {
		return sum, false
	}
	m := e.Value.(*memo)
	if m.key != key || !h.trusted(m) {
		return sum, false
	}
	h.ll.MoveToFront(e)
	return m.sum, true
}

func (h *Hasher) remember(m *memo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e, ok := h.m[m.path]; ok {
		e.Value = m
		h.ll.MoveToFront(e)
		return
	}
	h.m[m.path] = h.ll.PushFront(m)
	for h.ll.Len() > h.max {
		old := h.ll.Back()
		h.ll.Remove(old)
		delete(h.m, old.Value.(*memo).path)
	}
}

// SumFile returns the content hash of f, open for reading at path (resolved), reading it
// only when its stat key is not one remembered and trusted for path. limit bounds the
// bytes read (ErrTooLarge past it); a file whose stat changes while it is read is
// ErrChanged.
func (h *Hasher) SumFile(f *os.File, path string, limit int64) (FileSum, error) {
	t0 := time.Now()
	fi, err := f.Stat()
	h.stats.Add(1)
	h.statNS.Add(uint64(time.Since(t0)))
	if err != nil {
		return FileSum{}, err
	}
	key := statKeyOf(fi)
	if sum, ok := h.recall(path, key); ok {
		return FileSum{Path: path, Sum: sum, Stat: key}, nil
	}
	if key.Size > limit {
		return FileSum{}, ErrTooLarge
	}
	t1 := time.Now()
	d := sha256.New()
	n, err := io.CopyBuffer(d, io.LimitReader(f, limit+1), make([]byte, 64<<10))
	h.hashed.Add(1)
	h.hashBytes.Add(uint64(n))
	if err != nil {
		h.hashNS.Add(uint64(time.Since(t1)))
		return FileSum{}, err
	}
	if n > limit {
		h.hashNS.Add(uint64(time.Since(t1)))
		return FileSum{}, ErrTooLarge
	}
	fi, err = f.Stat()
	h.hashNS.Add(uint64(time.Since(t1)))
	if err != nil {
		return FileSum{}, err
	}
	if statKeyOf(fi) != key || n != key.Size {
		return FileSum{}, ErrChanged
	}
	fs := FileSum{Path: path, Stat: key}
	copy(fs.Sum[:], d.Sum(nil))
	h.remember(&memo{path: path, key: key, sum: fs.Sum, at: t0})
	return fs, nil
}

// SumPath is SumFile of a path the configuration names (a model's file), with no size
// limit.
func (h *Hasher) SumPath(path string) (FileSum, error) {
	f, err := os.Open(path)
	if err != nil {
		return FileSum{}, err
	}
	defer f.Close()
	return h.SumFile(f, path, 1<<62)
}

// Unchanged reports whether the file hashed as fs still has the same stat key: its
// answer, computed meanwhile, is then the answer for those bytes.
func (h *Hasher) Unchanged(fs FileSum) bool {
	fi, err := os.Stat(fs.Path)
	return err == nil && statKeyOf(fi) == fs.Stat
}

// Revision is a model's revision: the hex SHA-256 of its kind, its settings that change
// answers (thresholds, conf, iou, labels), and the role and content hash of each of its
// files (modelrev.Files), hashed through h (each file version once).
func Revision(h *Hasher, m *config.Model) (string, error) {
	files, err := modelrev.Files(m)
	if err != nil {
		return "", err
	}
	if len(files) == 0 {
		return "", fmt.Errorf("model %s: no files found", m.Name)
	}
	d := sha256.New()
	settings, _ := json.Marshal(struct {
		Kind                          string
		General, Character, Conf, IoU float64
		Labels                        []string
	}{m.Kind, m.General, m.Character, m.Conf, m.IoU, m.Labels})
	fmt.Fprintf(d, "ortbus model revision 1\x00%s\x00", settings)
	for _, f := range files {
		fs, err := h.SumPath(f.Path)
		if err != nil {
			return "", fmt.Errorf("model %s: %s: %w", m.Name, f.Role, err)
		}
		fmt.Fprintf(d, "%s\x00%x\x00", f.Role, fs.Sum)
	}
	return hex.EncodeToString(d.Sum(nil)), nil
}
