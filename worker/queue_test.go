package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/models"
	"github.com/ortbus/ortbus/ort"
)

// The worker's local queues (queue.go), unit by unit, in process: no NATS, no runtime.

// classOrder is the worker's class order, highest priority first.
var classOrder = []string{"urgent", "interactive", "batch"}

// qModel is a model that is never run: queues only compare models and ask Batchable.
// It is a comparable value, so two qModels with the same fields are the same model.
type qModel struct {
	name      string
	batchable bool
	cap       int // MaxBatch: what its network takes in one call (0: no limit of its own)
}

func (m qModel) Name() string                                       { return m.name }
func (qModel) Kind() string                                         { return "tagger-pixai" }
func (qModel) Ops() []string                                        { return []string{"tag", "embed"} }
func (m qModel) Batchable(string) bool                              { return m.batchable && m.cap != 1 }
func (m qModel) MaxBatch() int                                      { return m.cap }
func (qModel) Sessions() []*ort.Session                             { return nil }
func (qModel) Warmup(context.Context, int) error                    { return nil }
func (qModel) Close() error                                         { return nil }
func (qModel) Prepare(string, *codec.WorkItem) (models.Item, error) { return nil, nil }
func (qModel) Run(context.Context, string, []models.Item) ([]codec.Replier, []error) {
	return nil, nil
}

var (
	modelA = qModel{name: "a", batchable: true}
	modelB = qModel{name: "b", batchable: true}
	modelS = qModel{name: "s"} // not batchable (like segment)
)

// qjob is a queued work item of class for model m and op, with its own context.
func qjob(id, class string, m models.Model, op string) *job {
	ctx, cancel := context.WithCancel(context.Background())
	return &job{item: &codec.WorkItem{Request: codec.Request{ID: id}, Op: op}, op: op, class: class, model: m, ctx: ctx, cancel: cancel}
}

func mustPut(t *testing.T, q *queues, js ...*job) {
	t.Helper()
	for _, j := range js {
		if !q.put(j) {
			t.Fatalf("put %s (%s) refused", j.item.ID, j.class)
		}
	}
}

func unitIDs(unit []*job) []string {
	var out []string
	for _, j := range unit {
		out = append(out, j.item.ID)
	}
	return out
}

// takeAsync runs take in a goroutine; the result arrives on the channel.
func takeAsync(q *queues) <-chan []*job {
	ch := make(chan []*job, 1)
	go func() { ch <- q.take() }()
	return ch
}

// await returns take's unit, or fails the test if take never returns (a guard against a
// hang, not a latency bound: a correct take returns in microseconds here).
func await(t *testing.T, ch <-chan []*job) []*job {
	t.Helper()
	select {
	case u := <-ch:
		return u
	case <-time.After(10 * time.Second):
		t.Fatal("take did not return")
		return nil
	}
}

// gathering waits until a slot has popped the only queued batch job and is gathering a
// batch for it: nothing of class batch queued, nothing running yet, and n ids held.
func gathering(t *testing.T, q *queues, n int) {
	t.Helper()
	for i := 0; i < 20000; i++ {
		queued, running, held := q.counts()
		if queued["batch"] == 0 && running["batch"] == 0 && len(held) == n {
			return
		}
		time.Sleep(500 * time.Microsecond)
	}
	t.Fatal("the slot never started gathering a batch")
}

// TestQueueStrictPriorityAndFIFO: a slot takes urgent before interactive before batch,
// whatever the arrival order, and in arrival order within a class.
func TestQueueStrictPriorityAndFIFO(t *testing.T) {
	q := newQueues(classOrder, 16, 1, time.Hour)
	mustPut(t, q,
		qjob("b1", "batch", modelA, "tag"),
		qjob("i1", "interactive", modelA, "tag"),
		qjob("b2", "batch", modelA, "tag"),
		qjob("u1", "urgent", modelA, "tag"),
		qjob("i2", "interactive", modelA, "tag"),
		qjob("u2", "urgent", modelA, "tag"),
	)
	var got []string
	for range 6 {
		unit := q.take()
		if len(unit) != 1 {
			t.Fatalf("unit %v: without batching a unit is one job", unitIDs(unit))
		}
		got = append(got, unit[0].item.ID)
		q.done(unit)
	}
	if want := []string{"u1", "u2", "i1", "i2", "b1", "b2"}; !slices.Equal(got, want) {
		t.Fatalf("taken %v, want %v", got, want)
	}
}

// TestQueueLaterHigherClassOvertakes: work of a higher class that arrives while lower
// work waits is taken first by the next free slot.
func TestQueueLaterHigherClassOvertakes(t *testing.T) {
	q := newQueues(classOrder, 16, 1, time.Hour)
	mustPut(t, q, qjob("b1", "batch", modelA, "tag"), qjob("b2", "batch", modelA, "tag"))
	first := q.take()
	mustPut(t, q, qjob("i1", "interactive", modelA, "tag"))
	next := q.take()
	if unitIDs(first)[0] != "b1" || unitIDs(next)[0] != "i1" {
		t.Fatalf("took %v then %v, want b1 then i1", unitIDs(first), unitIDs(next))
	}
}

// TestQueueBound: put refuses an item once its class holds bound items (other classes
// are bounded separately), takes again once one leaves, and refuses everything once the
// queues are closed.
func TestQueueBound(t *testing.T) {
	q := newQueues(classOrder, 2, 1, time.Hour)
	mustPut(t, q, qjob("i1", "interactive", modelA, "tag"), qjob("i2", "interactive", modelA, "tag"))
	if q.put(qjob("i3", "interactive", modelA, "tag")) {
		t.Fatal("put past the bound accepted")
	}
	mustPut(t, q, qjob("b1", "batch", modelA, "tag")) // another class: its own bound
	queued, _, held := q.counts()
	if queued["interactive"] != 2 || queued["batch"] != 1 || slices.Contains(held, "i3") {
		t.Fatalf("queued %v held %v after a refused put", queued, held)
	}
	// Running items do not count against the bound: only queued ones do.
	q.take()
	mustPut(t, q, qjob("i4", "interactive", modelA, "tag"))

	q.close()
	if q.put(qjob("u1", "urgent", modelA, "tag")) {
		t.Fatal("put on closed queues accepted")
	}
}

// TestQueueCloseDrains: a closed queue still hands out what it holds, then take returns
// nil; a slot blocked on empty queues is woken by close.
func TestQueueCloseDrains(t *testing.T) {
	q := newQueues(classOrder, 4, 1, time.Hour)
	ch := takeAsync(q)
	mustPut(t, q, qjob("i1", "interactive", modelA, "tag"))
	if u := await(t, ch); len(u) != 1 || u[0].item.ID != "i1" {
		t.Fatalf("blocked take got %v, want [i1]", unitIDs(u))
	}
	mustPut(t, q, qjob("i2", "interactive", modelA, "tag"))
	q.close()
	if u := q.take(); len(u) != 1 || u[0].item.ID != "i2" {
		t.Fatalf("take after close got %v, want the queued i2", unitIDs(u))
	}
	if u := q.take(); u != nil {
		t.Fatalf("take on closed, empty queues got %v, want nil", unitIDs(u))
	}

	blocked := newQueues(classOrder, 4, 1, time.Hour)
	ch = takeAsync(blocked)
	blocked.close()
	if u := await(t, ch); u != nil {
		t.Fatalf("blocked take woken by close got %v, want nil", unitIDs(u))
	}
}

// TestQueueBatchGathersSameModelAndOp: a batch slot with max_batch > 1 gathers queued
// items of its first item's model and op only, in order, up to max_batch; the others keep
// their places.
func TestQueueBatchGathersSameModelAndOp(t *testing.T) {
	q := newQueues(classOrder, 16, 3, time.Hour)
	mustPut(t, q,
		qjob("a1", "batch", modelA, "tag"),
		qjob("b1", "batch", modelB, "tag"),   // other model
		qjob("ae", "batch", modelA, "embed"), // other op
		qjob("a2", "batch", modelA, "tag"),
		qjob("a3", "batch", modelA, "tag"),
		qjob("a4", "batch", modelA, "tag"), // past max_batch
	)
	// Three of a/tag fill the batch: it returns at once (max_delay is an hour).
	unit := await(t, takeAsync(q))
	if got := unitIDs(unit); !slices.Equal(got, []string{"a1", "a2", "a3"}) {
		t.Fatalf("batch %v, want [a1 a2 a3]", got)
	}
	if _, running, _ := q.counts(); running["batch"] != 3 {
		t.Fatalf("running %v, want 3 batch items for one unit", running)
	}
	q.done(unit)
	// What was left keeps its order: b1 first, then (a different unit) ae.
	q.maxBatch = 1
	var got []string
	for range 3 {
		u := q.take()
		got = append(got, unitIDs(u)...)
		q.done(u)
	}
	if !slices.Equal(got, []string{"b1", "ae", "a4"}) {
		t.Fatalf("left over taken as %v, want [b1 ae a4]", got)
	}
}

// TestQueueBatchOnlyWhereItApplies: no gathering outside the batch class, with max_batch
// <= 1, or for a model that cannot batch its op.
func TestQueueBatchOnlyWhereItApplies(t *testing.T) {
	cases := []struct {
		name     string
		maxBatch int
		class    string
		model    qModel
	}{
		{"interactive class", 4, "interactive", modelA},
		{"max_batch 1", 1, "batch", modelA},
		{"unbatchable model", 4, "batch", modelS},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := newQueues(classOrder, 16, c.maxBatch, time.Hour)
			mustPut(t, q, qjob("x1", c.class, c.model, "tag"), qjob("x2", c.class, c.model, "tag"))
			// max_delay is an hour: a unit of one coming back at all shows no gathering.
			if u := await(t, takeAsync(q)); len(u) != 1 || u[0].item.ID != "x1" {
				t.Fatalf("unit %v, want [x1] alone", unitIDs(u))
			}
		})
	}
}

// TestQueueBatchWaitsForLateItems: a gathering slot takes items of its model and op that
// arrive while it waits (not others), and returns as soon as the batch is full.
func TestQueueBatchWaitsForLateItems(t *testing.T) {
	q := newQueues(classOrder, 16, 3, time.Hour)
	mustPut(t, q, qjob("a1", "batch", modelA, "tag"))
	ch := takeAsync(q)
	gathering(t, q, 1)
	mustPut(t, q, qjob("a2", "batch", modelA, "tag"))
	mustPut(t, q, qjob("b1", "batch", modelB, "tag"))
	select {
	case u := <-ch:
		t.Fatalf("batch returned %v before it was full or max_delay passed", unitIDs(u))
	default:
	}
	mustPut(t, q, qjob("a3", "batch", modelA, "tag"))
	if got := unitIDs(await(t, ch)); !slices.Equal(got, []string{"a1", "a2", "a3"}) {
		t.Fatalf("batch %v, want [a1 a2 a3]", got)
	}
	if queued, _, _ := q.counts(); queued["batch"] != 1 {
		t.Fatalf("queued %v, want b1 left", queued)
	}
}

// TestQueueBatchMaxDelay: a batch that does not fill goes with what it has once max_delay
// has passed (without it the slot would wait for ever: max_batch is never reached).
func TestQueueBatchMaxDelay(t *testing.T) {
	q := newQueues(classOrder, 16, 8, 2*time.Millisecond)
	mustPut(t, q, qjob("a1", "batch", modelA, "tag"), qjob("a2", "batch", modelA, "tag"))
	if got := unitIDs(await(t, takeAsync(q))); !slices.Equal(got, []string{"a1", "a2"}) {
		t.Fatalf("batch %v, want [a1 a2] once max_delay passed", got)
	}
	// Alone, too.
	mustPut(t, q, qjob("a3", "batch", modelA, "tag"))
	if got := unitIDs(await(t, takeAsync(q))); !slices.Equal(got, []string{"a3"}) {
		t.Fatalf("batch %v, want [a3]", got)
	}
}

// TestQueueBatchYieldsToHigherClass: a gathering batch stops waiting as soon as a higher
// class has work (max_delay is an hour and the batch is not full), and the next slot
// takes that work first.
func TestQueueBatchYieldsToHigherClass(t *testing.T) {
	for _, class := range []string{"urgent", "interactive"} {
		t.Run(class, func(t *testing.T) {
			q := newQueues(classOrder, 16, 8, time.Hour)
			mustPut(t, q, qjob("a1", "batch", modelA, "tag"))
			ch := takeAsync(q)
			gathering(t, q, 1)
			mustPut(t, q, qjob("a2", "batch", modelA, "tag"), qjob("a3", "batch", modelA, "tag"), qjob("h1", class, modelA, "tag"))
			// The items of its model that came with h1 are gathered before it stops.
			if got := unitIDs(await(t, ch)); !slices.Equal(got, []string{"a1", "a2", "a3"}) {
				t.Fatalf("batch %v, want [a1 a2 a3]", got)
			}
			if next := q.take(); len(next) != 1 || next[0].item.ID != "h1" {
				t.Fatalf("next unit %v, want the %s item h1", unitIDs(next), class)
			}
		})
	}
}

// TestQueueHigherWaiting: only classes above the given one count.
func TestQueueHigherWaiting(t *testing.T) {
	q := newQueues(classOrder, 16, 1, time.Hour)
	mustPut(t, q, qjob("b1", "batch", modelA, "tag"))
	if q.higherWaiting("batch") || q.higherWaiting("interactive") {
		t.Fatal("batch work counted as higher")
	}
	mustPut(t, q, qjob("i1", "interactive", modelA, "tag"))
	if !q.higherWaiting("batch") || q.higherWaiting("interactive") || q.higherWaiting("urgent") {
		t.Fatal("interactive work: higher than batch only")
	}
	mustPut(t, q, qjob("u1", "urgent", modelA, "tag"))
	if !q.higherWaiting("interactive") || q.higherWaiting("urgent") {
		t.Fatal("urgent work: higher than interactive, not than itself")
	}
}

// TestQueueBatchCaps: a model's cap (from memory admission, or its own max_batch) limits
// its dynamic batches below the pool's max_batch; a cap above it changes nothing; other
// models are not affected.
func TestQueueBatchCaps(t *testing.T) {
	q := newQueues(classOrder, 32, 4, time.Hour)
	q.caps["a"] = 2
	q.caps["b"] = 100
	for _, id := range []string{"a1", "a2", "a3"} {
		mustPut(t, q, qjob(id, "batch", modelA, "tag"))
	}
	for _, id := range []string{"b1", "b2", "b3", "b4", "b5"} {
		mustPut(t, q, qjob(id, "batch", modelB, "tag"))
	}
	// Each unit below is full at its limit, so it comes back without waiting.
	if got := unitIDs(await(t, takeAsync(q))); !slices.Equal(got, []string{"a1", "a2"}) {
		t.Fatalf("capped batch %v, want [a1 a2]", got)
	}
	// a3 is next in line: run it alone (max_batch 1 for this take) to reach the b items.
	q.maxBatch = 1
	q.take()
	q.maxBatch = 4
	if got := unitIDs(await(t, takeAsync(q))); !slices.Equal(got, []string{"b1", "b2", "b3", "b4"}) {
		t.Fatalf("batch of a model capped above max_batch %v, want [b1 b2 b3 b4]", got)
	}
}

// TestQueueBatchNetworkCap: a model whose network takes at most N items in one call (its
// batch dimension fixed at N) is gathered N at a time under a larger max_batch, whatever
// cap its name has (a reload's newer copy); one fixed at 1 is never gathered: each item
// runs alone.
func TestQueueBatchNetworkCap(t *testing.T) {
	q := newQueues(classOrder, 32, 8, time.Hour)
	two := qModel{name: "two", batchable: true, cap: 2}
	one := qModel{name: "one", batchable: true, cap: 1}
	q.caps["two"] = 8
	for _, id := range []string{"t1", "t2", "t3"} {
		mustPut(t, q, qjob(id, "batch", two, "tag"))
	}
	if got := unitIDs(await(t, takeAsync(q))); !slices.Equal(got, []string{"t1", "t2"}) {
		t.Fatalf("batch of a network fixed at 2: %v, want [t1 t2]", got)
	}
	q.maxBatch = 1
	q.take() // t3, alone
	q.maxBatch = 8
	for _, id := range []string{"o1", "o2", "o3"} {
		mustPut(t, q, qjob(id, "batch", one, "tag"))
	}
	for _, want := range []string{"o1", "o2", "o3"} {
		if got := unitIDs(await(t, takeAsync(q))); !slices.Equal(got, []string{want}) {
			t.Fatalf("a network fixed at 1: unit %v, want [%s] alone", got, want)
		}
	}
}

// TestQueueCancelQueued: a queued job is removed and returned (to be answered
// cancelled); its context is left alone; it is no longer held or taken.
func TestQueueCancelQueued(t *testing.T) {
	q := newQueues(classOrder, 16, 1, time.Hour)
	j1, j2 := qjob("r1", "interactive", modelA, "tag"), qjob("r2", "interactive", modelA, "tag")
	mustPut(t, q, j1, j2)
	got, found := q.cancel("r1")
	if !found || got != j1 {
		t.Fatalf("cancel queued r1: %v %v, want the job and found", got, found)
	}
	if j1.ctx.Err() != nil {
		t.Fatal("a queued job's context was cancelled: the caller answers it instead")
	}
	queued, _, held := q.counts()
	if queued["interactive"] != 1 || !slices.Equal(held, []string{"r2"}) {
		t.Fatalf("after cancel: queued %v held %v, want r2 only", queued, held)
	}
	if u := q.take(); u[0] != j2 {
		t.Fatalf("took %v after r1 was cancelled, want r2", unitIDs(u))
	}
	if got, found := q.cancel("r1"); got != nil || found {
		t.Fatal("a cancelled id is still found")
	}
	if got, found := q.cancel("nope"); got != nil || found {
		t.Fatal("an unknown id is found")
	}
}

// TestQueueCancelRunning: a running job's context is cancelled and nil returned (the
// slot answers it); it stays held until done.
func TestQueueCancelRunning(t *testing.T) {
	q := newQueues(classOrder, 16, 1, time.Hour)
	j := qjob("r1", "interactive", modelA, "tag")
	mustPut(t, q, j)
	unit := q.take()
	got, found := q.cancel("r1")
	if got != nil || !found {
		t.Fatalf("cancel running r1: %v %v, want nil and found", got, found)
	}
	if !errors.Is(j.ctx.Err(), context.Canceled) {
		t.Fatalf("running job's context: %v, want cancelled", j.ctx.Err())
	}
	if _, running, held := q.counts(); running["interactive"] != 1 || !slices.Equal(held, []string{"r1"}) {
		t.Fatalf("running %v held %v: the job runs until its slot is done", running, held)
	}
	q.done(unit)
	if _, running, held := q.counts(); running["interactive"] != 0 || len(held) != 0 {
		t.Fatalf("after done: running %v held %v", running, held)
	}
	if _, found := q.cancel("r1"); found {
		t.Fatal("a finished id is still found")
	}
}

// TestQueueCountsAndHeld: counts reports queued and running per class (every class, even
// idle ones) and the ids held; jobs without an id are queued but not held; done of a
// job whose id was reused by a newer one (a retry) keeps the newer one held.
func TestQueueCountsAndHeld(t *testing.T) {
	q := newQueues(classOrder, 16, 1, time.Hour)
	mustPut(t, q,
		qjob("i1", "interactive", modelA, "tag"),
		qjob("i2", "interactive", modelA, "tag"),
		qjob("b1", "batch", modelA, "tag"),
		qjob("", "batch", modelA, "tag"),
	)
	unit := q.take() // i1
	queued, running, held := q.counts()
	slices.Sort(held)
	if queued["urgent"] != 0 || queued["interactive"] != 1 || queued["batch"] != 2 || len(queued) != 3 {
		t.Fatalf("queued %v", queued)
	}
	if running["interactive"] != 1 || running["batch"] != 0 || len(running) != 3 {
		t.Fatalf("running %v", running)
	}
	if !slices.Equal(held, []string{"b1", "i1", "i2"}) {
		t.Fatalf("held %v, want [b1 i1 i2]", held)
	}

	// A retry of i1 arrives while the first delivery still runs.
	retry := qjob("i1", "interactive", modelA, "tag")
	mustPut(t, q, retry)
	q.done(unit)
	if _, _, held := q.counts(); !slices.Contains(held, "i1") {
		t.Fatal("done of the old i1 released the retry's id")
	}
	if got, found := q.cancel("i1"); !found || got != retry {
		t.Fatal("the retry of i1 is not the one held")
	}
}

// TestQueueIdle: idle returns at once when nothing is queued or running, and otherwise
// only after the last running unit is done.
func TestQueueIdle(t *testing.T) {
	q := newQueues(classOrder, 16, 1, time.Hour)
	q.idle() // empty: returns
	mustPut(t, q, qjob("i1", "interactive", modelA, "tag"))
	unit := q.take()
	idle := make(chan struct{})
	go func() { q.idle(); close(idle) }()
	select {
	case <-idle:
		t.Fatal("idle returned while a job was running")
	case <-time.After(20 * time.Millisecond):
	}
	q.done(unit)
	select {
	case <-idle:
	case <-time.After(10 * time.Second):
		t.Fatal("idle did not return after the last job was done")
	}
}

// recModel records its warm-ups.
type recModel struct {
	qModel
	warmups []int
}

func (m *recModel) Warmup(_ context.Context, n int) error {
	m.warmups = append(m.warmups, n)
	return nil
}

// TestMeasureBatchCap: a model's batch cap is the pool's max_batch, capped by the model's
// own max_batch and by what its network takes in one call (models.Limit: a batch
// dimension fixed at 1 takes one item, fixed at N at most N); warm-ups run at batch 1 and
// at that cap; a declared peak is taken as declared (it is not capped to a budget: the
// worker refuses it instead).
func TestMeasureBatchCap(t *testing.T) {
	w := &loader{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cases := []struct {
		poolBatch, modelBatch, network int
		want                           int
		warmups                        []int
	}{
		{8, 3, 0, 3, []int{1, 3}},
		{4, 0, 0, 4, []int{1, 4}},
		{2, 16, 0, 2, []int{1, 2}},
		{0, 5, 0, 1, []int{1}},
		{8, 0, 1, 1, []int{1}},    // [1,3,640,640]: no batching, no warm-up at 8
		{8, 0, 4, 4, []int{1, 4}}, // fixed at 4
		{8, 3, 4, 3, []int{1, 3}},
		{2, 0, 4, 2, []int{1, 2}},
	}
	for _, c := range cases {
		a := modelA
		a.cap = c.network
		m := &recModel{qModel: a}
		mc := &config.Model{Name: "a", Kind: "tagger-pixai", MaxBatch: c.modelBatch, Memory: 64 << 20}
		p := &config.Pool{Name: "cpu", Device: "cpu", MaxBatch: c.poolBatch}
		st := w.measure(m, mc, p, 1<<20, true, 0, false)
		if st.MaxBatch != c.want || !slices.Equal(m.warmups, c.warmups) {
			t.Errorf("pool max_batch %d, model %d, network %d: cap %d warm-ups %v, want %d %v", c.poolBatch, c.modelBatch, c.network, st.MaxBatch, m.warmups, c.want, c.warmups)
		}
		if st.PeakBytes != 64<<20 || st.PeakSource != "declared" || st.Name != "a" || !st.Loaded {
			t.Errorf("status %+v, want the declared 64MiB peak", st)
		}
	}
}
