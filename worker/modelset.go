package worker

import (
	"slices"
	"sync"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/models"
)

// modelSet is the worker's models, with one owner: the serving goroutines look models up
// in it (acquire), the heartbeat reads their states (statuses), and the loader
// (loader.go: at start-up, and in place for the control verbs) changes it, each under its
// lock. Its rules:
//
//  1. Each model has a state: loading (a load in place of a model it has no copy of),
//     ready (a copy serves), or failed (with its load error). A model it does not
//     list is unknown.
//  2. A job holds the copy it was accepted for from its acceptance (acquire, which
//     counts it in the copy's uses) to its one answer (release). A reload swaps in a
//     new copy for the jobs accepted from then on; an unload takes the model out of
//     the set at once (a job accepted from then on is answered unknown_model). Either
//     retires the old copy, whose jobs run on it and are answered.
//  3. A retired copy's sessions are closed once its last job is answered, never under a
//     running ONNX Runtime call: the job of a running call is answered after the call.
//  4. A request names its model, or the set picks the first ready model, in order, that
//     serves its op (acquire). A failed model is answered model_unavailable (a model is
//     the unit of failure): named, or when it is the only model of the set for the op.
type modelSet struct {
	pool, worker string // for the answers of acquire

	mu sync.Mutex
	// order is the models' names in the pool's order: ready, failed and loading ones.
	order  []string
	ready  map[string]*loaded
	failed map[string]*codec.Error
	status map[string]codec.ModelStatus
	// ep is the execution provider of the first ready model's sessions.
	ep string
}

// loaded is one copy of a model: what a job holds.
type loaded struct {
	models.Model
	uses    int  // jobs holding it (rule 2), under modelSet.mu
	retired bool // out of the set: closed once uses is 0 (rule 3)
	once    sync.Once
	closed  chan struct{} // closed once its sessions are
}

func newModelSet(pool, worker string) *modelSet {
	return &modelSet{pool: pool, worker: worker, ready: map[string]*loaded{}, failed: map[string]*codec.Error{}, status: map[string]codec.ModelStatus{}}
}

// newLoaded wraps a model just opened.
func newLoaded(m models.Model) *loaded { return &loaded{Model: m, closed: make(chan struct{})} }

// close closes the copy's sessions, once (a close that fails or panics is ignored).
func (l *loaded) close() {
	l.once.Do(func() {
		closeQuietly(l.Model)
		close(l.closed)
	})
}

// place puts name in the order: at its place in want (the pool's models in force) among
// the models the set has, else at the end. Under mu.
func (s *modelSet) place(name string, want []string) {
	if slices.Contains(s.order, name) {
		return
	}
	i := slices.Index(want, name)
	if i < 0 {
		s.order = append(s.order, name)
		return
	}
	at := len(s.order)
	for j, n := range s.order {
		if k := slices.Index(want, n); k > i {
			at = j
			break
		}
	}
	s.order = slices.Insert(s.order, at, name)
}

// serve makes m (with its status) the ready copy of its model, placed per want, and
// returns the copy it replaces, retired, or nil (rule 2).
func (s *modelSet) serve(m models.Model, st codec.ModelStatus, want []string) *loaded {
	l, ok := m.(*loaded)
	if !ok {
		l = newLoaded(m)
	}
	s.mu.Lock()
	name := st.Name
	s.place(name, want)
	old := s.ready[name]
	s.ready[name] = l
	delete(s.failed, name)
	s.status[name] = st
	if s.ep == "" {
		if ss := m.Sessions(); len(ss) > 0 {
			s.ep = ss[0].EP
		}
	}
	closeNow := s.retireLocked(old)
	s.mu.Unlock()
	if closeNow {
		old.close()
	}
	return old
}

// fail records name as failed with st (its load error in st.Error), placed per want.
// A ready copy, if any, stays (a reload whose new copy failed: the old one serves).
func (s *modelSet) fail(st codec.ModelStatus, want []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.place(st.Name, want)
	if s.ready[st.Name] != nil {
		return
	}
	s.failed[st.Name] = st.Error
	s.status[st.Name] = st
}

// loading marks name loading, placed per want, unless a copy of it serves (it stays
// ready meanwhile). It reports whether one serves.
func (s *modelSet) loading(name, kind string, want []string) (serving bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ready[name] != nil {
		return true
	}
	s.place(name, want)
	delete(s.failed, name)
	s.status[name] = codec.ModelStatus{Name: name, Kind: kind, State: codec.ModelLoading}
	return false
}

// remove takes name out of the set (rule 2) and returns its ready copy, retired, or nil;
// found is false when the set does not list it.
func (s *modelSet) remove(name string) (old *loaded, found bool) {
	s.mu.Lock()
	_, found = s.status[name]
	s.order = slices.DeleteFunc(s.order, func(n string) bool { return n == name })
	old = s.ready[name]
	delete(s.ready, name)
	delete(s.failed, name)
	delete(s.status, name)
	closeNow := s.retireLocked(old)
	s.mu.Unlock()
	if closeNow {
		old.close()
	}
	return old, found
}

// retireLocked retires l (nil: nothing) and reports whether it must be closed now (no job
// holds it). Under mu.
func (s *modelSet) retireLocked(l *loaded) bool {
	if l == nil {
		return false
	}
	l.retired = true
	return l.uses == 0
}

// release ends a job's hold on its copy (rule 2), closing a retired copy whose last job
// this was (rule 3). m is the job's model: a copy of this set, or nil.
func (s *modelSet) release(m models.Model) {
	l, ok := m.(*loaded)
	if !ok || l == nil {
		return
	}
	s.mu.Lock()
	l.uses--
	closeNow := l.retired && l.uses == 0
	s.mu.Unlock()
	if closeNow {
		l.close()
	}
}

// statuses is every model's status, in order.
func (s *modelSet) statuses() []codec.ModelStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]codec.ModelStatus, 0, len(s.order))
	for _, n := range s.order {
		out = append(out, s.status[n])
	}
	return out
}

// state is name's status, and whether the set lists it.
func (s *modelSet) state(name string) (codec.ModelStatus, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.status[name]
	return st, ok
}

// names are the models in order, and the failed ones.
func (s *modelSet) names() (order, failed []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.order {
		if s.failed[n] != nil {
			failed = append(failed, n)
		}
	}
	return slices.Clone(s.order), failed
}

// len is how many models the set lists.
func (s *modelSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.order)
}

// execProvider is the EP of the first ready model's sessions ("" before any).
func (s *modelSet) execProvider() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ep
}

// closeAll retires and closes every ready copy (the worker's Close: its jobs are answered).
func (s *modelSet) closeAll() {
	s.mu.Lock()
	var all []*loaded
	for name, l := range s.ready {
		all = append(all, l)
		delete(s.ready, name)
	}
	s.mu.Unlock()
	for _, l := range all {
		l.close()
	}
}

// acquire picks the model for a request (rule 4): the named one, or the set's first
// ready model that serves op (or, with no op either, the first ready model and its first
// op). The copy it returns is held by the request until its answer (rule 2: release).
func (s *modelSet) acquire(name, op string) (models.Model, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if name != "" {
		return s.acquireNamed(name, op)
	}
	failed := ""
	for _, n := range s.order {
		l, ok := s.ready[n]
		if !ok {
			if s.failed[n] != nil && failed == "" && (op == "" || kindServes(s.status[n].Kind, op)) {
				failed = n
			}
			continue
		}
		if op == "" {
			l.uses++
			return l, l.Ops()[0], nil
		}
		if slices.Contains(l.Ops(), op) {
			l.uses++
			return l, op, nil
		}
	}
	if failed != "" {
		return nil, "", s.unavailable(failed, s.failed[failed])
	}
	return nil, "", codec.Errorf(codec.CodeUnknownOp, "no model of pool %s serves op %q", s.pool, op).With("pool", s.pool)
}

// acquireNamed is acquire of the model a request names. Under mu.
func (s *modelSet) acquireNamed(name, op string) (models.Model, string, error) {
	l, ok := s.ready[name]
	if !ok {
		if le := s.failed[name]; le != nil {
			return nil, "", s.unavailable(name, le)
		}
		if st, ok := s.status[name]; ok && st.State == codec.ModelLoading {
			return nil, "", codec.Errorf(codec.CodeUnknownModel, "model %q is still loading on worker %s", name, s.worker).With("pool", s.pool).With("worker", s.worker)
		}
		return nil, "", codec.Errorf(codec.CodeUnknownModel, "model %q is not loaded by pool %s (it has %v)", name, s.pool, s.order).With("pool", s.pool)
	}
	if op == "" {
		op = l.Ops()[0]
	}
	if !slices.Contains(l.Ops(), op) {
		return nil, "", codec.Errorf(codec.CodeUnknownOp, "model %s does not serve op %q (it serves %v)", name, op, l.Ops())
	}
	l.uses++
	return l, op, nil
}

// kindServes reports whether model kind serves op.
func kindServes(kind, op string) bool {
	k, ok := config.KindOf(kind)
	return ok && slices.Contains(k.Ops, op)
}

// unavailable is the model_unavailable answer for the failed model name: its load error
// le in details.error.
func (s *modelSet) unavailable(name string, le *codec.Error) *codec.Error {
	if le == nil {
		le = codec.Errorf(codec.CodeInternal, "unknown load error")
	}
	return codec.Errorf(codec.CodeModelUnavailable, "model %s failed to load on worker %s: %s", name, s.worker, le.Message).
		With("model", name).With("pool", s.pool).With("worker", s.worker).With("error", le)
}

// closeQuietly closes a model, ignoring its error and any panic.
func closeQuietly(m models.Model) {
	defer func() { recover() }()
	m.Close()
}
