package worker

import (
	"slices"
	"sync"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/models"
)

// modelSet is the worker's models, with one owner: the serving goroutines look models up
// in it (modelFor), the heartbeat reads their states (statuses), and the load and unload
// control verbs change it (inplace.go), each under its lock. Its rules:
//
//  1. Each model has a state: loading (a load in place of a model it has no copy of),
//     ready (a copy serves), or failed (with its load error). A model it does not
//     list is unknown.
//  2. A job holds the copy it was accepted for from its acceptance (modelFor, which
//     counts it in the copy's uses) to its one answer (release). A reload swaps in a
//     new copy for the jobs accepted from then on; an unload takes the model out of
//     the set at once (a job accepted from then on is answered unknown_model). Either
//     retires the old copy, whose jobs run on it and are answered.
//  3. A retired copy's sessions are closed once its last job is answered, never under a
//     running ONNX Runtime call: the job of a running call is answered after the call.
type modelSet struct {
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

func newModelSet() *modelSet {
	return &modelSet{ready: map[string]*loaded{}, failed: map[string]*codec.Error{}, status: map[string]codec.ModelStatus{}}
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
