package codec

import (
	"encoding/json"
	"slices"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
)

// Jobs: library-scale batch work kept in JetStream (see package jobs). A job is a list of
// image paths and one op; each path is one item, run once, with one result.

// JobSubmit asks for a job: op on every item (a list of paths, or the images of a
// directory). Job is optional: a client that names its job may send the same submit
// again (after a lost reply, say) without creating a second job or running an item twice.
type JobSubmit struct {
	Job   string   `msgpack:"job,omitempty" json:"job,omitempty"`
	Op    string   `msgpack:"op" json:"op"`
	Model string   `msgpack:"model,omitempty" json:"model,omitempty"`
	Class string   `msgpack:"class,omitempty" json:"class,omitempty"` // default batch
	Pool  string   `msgpack:"pool,omitempty" json:"pool,omitempty"`
	Items []string `msgpack:"items,omitempty" json:"items,omitempty"`
	Dir   *JobDir  `msgpack:"dir,omitempty" json:"dir,omitempty"`
	// Options are the op's request options applied to every item: thresholds (tag), conf
	// and iou (detect), timeout_ms (each item's deadline, from when it is dispatched) and
	// device. Other request fields are ignored.
	Options *Request `msgpack:"options,omitempty" json:"options,omitempty"`
	// Incremental answers each item whose result the gateway's cache holds (same bytes,
	// model revision, op and options) from the cache, and runs the rest.
	Incremental bool `msgpack:"incremental,omitempty" json:"incremental,omitempty"`
	// Anytime: the job's items run outside [jobs] windows too (the quiet hours hold only
	// the other jobs).
	Anytime bool `msgpack:"anytime,omitempty" json:"anytime,omitempty"`
	// Skipped and SkippedTotal: what a client that walked its directories itself (the
	// CLI) left out of items, with the reasons, kept with the job for job.status. Only
	// with items; at most MaxJobSkipsListed, each a reason of JobSkipReasons.
	Skipped      []JobSkip `msgpack:"skipped,omitempty" json:"skipped,omitempty"`
	SkippedTotal int       `msgpack:"skipped_total,omitempty" json:"skipped_total,omitempty"`
}

// JobDir names a directory whose images are the job's items.
type JobDir struct {
	Path string `msgpack:"path" json:"path"`
	// Glob filters base names (path.Match syntax, e.g. "*.png"); default: the image
	// extensions the workers decode.
	Glob      string `msgpack:"glob,omitempty" json:"glob,omitempty"`
	Recursive bool   `msgpack:"recursive,omitempty" json:"recursive,omitempty"`
}

// JobSubmitReply answers job.submit. Skipped lists the files of a directory submit that
// are not items (at most MaxJobSkipsListed of them; SkippedTotal counts them all), each
// with its reason: nothing is left out silently.
type JobSubmitReply struct {
	Job          string    `msgpack:"job" json:"job"`
	Total        int       `msgpack:"total" json:"total"`
	Skipped      []JobSkip `msgpack:"skipped,omitempty" json:"skipped,omitempty"`
	SkippedTotal int       `msgpack:"skipped_total,omitempty" json:"skipped_total,omitempty"`
}

// JobSkip is one entry of a directory that a job left out, and why (a JobSkip* reason).
type JobSkip struct {
	Path   string `msgpack:"path" json:"path"`
	Reason string `msgpack:"reason" json:"reason"`
}

// The reasons of a JobSkip.
const (
	// JobSkipDirectory: a subdirectory, and the submit was not recursive.
	JobSkipDirectory = "directory_not_recursive"
	// JobSkipNotImage: its content is no image format the workers load.
	JobSkipNotImage = "not_an_image"
	// JobSkipGlob: its name does not match the submit's glob.
	JobSkipGlob = "glob_mismatch"
	// JobSkipSymlink: a symlink (a walk follows none).
	JobSkipSymlink = "symlink"
	// JobSkipNotRegular: a FIFO, socket or device.
	JobSkipNotRegular = "not_a_regular_file"
	// JobSkipUnreadable: it could not be opened or read (permissions, gone meanwhile).
	JobSkipUnreadable = "unreadable"
)

// JobSkipReasons are the reasons a JobSkip may give.
var JobSkipReasons = []string{JobSkipDirectory, JobSkipNotImage, JobSkipGlob, JobSkipSymlink, JobSkipNotRegular, JobSkipUnreadable}

// MaxJobSkipsListed bounds the JobSkip entries a reply or a job's record lists.
const MaxJobSkipsListed = 256

// JobRef names a job (job.status, job.cancel, job.pause, job.resume).
type JobRef struct {
	Job string `msgpack:"job" json:"job"`
}

// Job states. A job is failed when the job store refused what its items need (their
// results, the marks of their runs) for good, or did not take it for jobs.ack_wait: it
// does not wait on storage without end, and JobStatus.Error says why.
const (
	JobRunning   = "running"
	JobDone      = "done"
	JobCancelled = "cancelled"
	JobFailed    = "failed"
	// JobPaused: paused by its owner (job.pause) until resumed (job.resume): its items
	// running finish, no other starts.
	JobPaused = "paused"
)

// JobStatus answers job.status, job.cancel, job.pause, job.resume and is one entry of
// job.list. Done counts
// items answered with the op's reply, Failed items answered with an error (Done + Failed
// is Total once the job is done); Running is what is delivered
// and not yet answered (across gateways); Redelivered counts items that needed more than
// one delivery. Error is why a failed job failed.
type JobStatus struct {
	Job           string  `msgpack:"job" json:"job"`
	State         string  `msgpack:"state" json:"state"`
	Op            string  `msgpack:"op" json:"op"`
	Model         string  `msgpack:"model,omitempty" json:"model,omitempty"`
	Class         string  `msgpack:"class" json:"class"`
	Pool          string  `msgpack:"pool,omitempty" json:"pool,omitempty"`
	Total         int     `msgpack:"total" json:"total"`
	Done          int     `msgpack:"done" json:"done"`
	Failed        int     `msgpack:"failed" json:"failed"`
	Running       int     `msgpack:"running" json:"running"`
	Redelivered   int     `msgpack:"redelivered" json:"redelivered"`
	RatePerS      float64 `msgpack:"rate_per_s" json:"rate_per_s"`
	EtaS          float64 `msgpack:"eta_s" json:"eta_s"`
	StartedUnixMS int64   `msgpack:"started_unix_ms" json:"started_unix_ms"`
	// PausedUnixMS is when a paused job was paused.
	PausedUnixMS   int64  `msgpack:"paused_unix_ms,omitempty" json:"paused_unix_ms,omitempty"`
	FinishedUnixMS int64  `msgpack:"finished_unix_ms,omitempty" json:"finished_unix_ms,omitempty"`
	Error          *Error `msgpack:"error,omitempty" json:"error,omitempty"`
	// Cached counts the items answered from the result cache, Computed those answered by
	// running (a result or an error): cached + computed = done + failed.
	Cached   int `msgpack:"cached" json:"cached"`
	Computed int `msgpack:"computed" json:"computed"`
	// Skipped and SkippedTotal: the files of its directory the job left out, as its
	// submit answered them.
	Skipped      []JobSkip `msgpack:"skipped,omitempty" json:"skipped,omitempty"`
	SkippedTotal int       `msgpack:"skipped_total,omitempty" json:"skipped_total,omitempty"`
	// Waiting says why a running job's items wait with none running: no pool it may
	// use can serve (each pool's error: runtime_missing, no live worker), or the class
	// is paused. Absent while items run, or when there is no reason to tell.
	Waiting *Error `msgpack:"waiting,omitempty" json:"waiting,omitempty"`
}

// Finished reports whether the job will change no more.
func (s *JobStatus) Finished() bool {
	return s.State == JobDone || s.State == JobCancelled || s.State == JobFailed
}

// JobListReply answers job.list: the jobs still kept, newest first.
type JobListReply struct {
	Jobs []JobStatus `msgpack:"jobs" json:"jobs"`
}

// JobResultsRequest asks for a job's results from sequence From (0: the first), at most
// Limit of them (0: as many as fit one reply).
type JobResultsRequest struct {
	Job   string `msgpack:"job" json:"job"`
	From  uint64 `msgpack:"from,omitempty" json:"from,omitempty"`
	Limit int    `msgpack:"limit,omitempty" json:"limit,omitempty"`
}

// JobResultsReply is one page of results, in the order they were recorded. Next is the
// From of the next page; More says whether results past this page exist now (a running
// job records more later).
type JobResultsReply struct {
	Job     string      `msgpack:"job" json:"job"`
	Op      string      `msgpack:"op" json:"op"` // the job's op: what each Result is
	Results []JobResult `msgpack:"results" json:"results"`
	Next    uint64      `msgpack:"next" json:"next"`
	More    bool        `msgpack:"more" json:"more"`
}

// JobResult is one item's outcome: the op's reply (Result) or an error.
type JobResult struct {
	Seq   uint64 `msgpack:"seq,omitempty" json:"seq,omitempty"`
	Index int    `msgpack:"i" json:"i"`
	Path  string `msgpack:"path" json:"path"`
	// Result is the op's reply (a TagReply for tag, ...).
	Result any    `msgpack:"result,omitempty" json:"result,omitempty"`
	Error  *Error `msgpack:"error,omitempty" json:"error,omitempty"`
	// Cached: the result came from the result cache (an incremental job).
	Cached bool `msgpack:"cached,omitempty" json:"cached,omitempty"`
}

// MaxJobIDLen bounds a job id; a job id is letters, digits, '-' and '_'.
const MaxJobIDLen = 64

// CheckJobID checks a job id from the wire: it names subjects and keys.
func CheckJobID(id string) error {
	if id == "" || len(id) > MaxJobIDLen {
		return Errorf(CodeBadRequest, "job: want 1 to %d characters, got %d", MaxJobIDLen, len(id)).With("field", "job")
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return Errorf(CodeBadRequest, "job: %q holds %q (letters, digits, - and _ only)", id, c).With("field", "job")
		}
	}
	return nil
}

// JobOps are the ops a job may run: those that take one image path.
var JobOps = []string{"tag", "embed", "detect", "segment"}

// Validate checks a job submission from the wire (paths are checked against the
// security roots where they are read).
func (s *JobSubmit) Validate() error {
	bad := badField
	if s.Job != "" {
		if err := CheckJobID(s.Job); err != nil {
			return err
		}
	}
	if err := checkNames(field{"op", s.Op}); err != nil {
		return err
	}
	ok := false
	for _, op := range JobOps {
		ok = ok || s.Op == op
	}
	if !ok {
		return bad("op", "%q cannot run as a job (ops: %s)", s.Op, strings.Join(JobOps, ", "))
	}
	if err := checkNames(field{"model", s.Model}, field{"class", s.Class}, field{"pool", s.Pool}); err != nil {
		return err
	}
	if (len(s.Items) == 0) == (s.Dir == nil) {
		return bad("items", "give items (a list of paths) or dir, not both and not neither")
	}
	for i, p := range s.Items {
		if p == "" {
			return bad("items", "item %d is empty", i)
		}
		if err := checkPaths(field{"items", p}); err != nil {
			return err
		}
	}
	if s.Dir != nil {
		if s.Dir.Path == "" {
			return bad("dir.path", "empty")
		}
		if err := checkPaths(field{"dir.path", s.Dir.Path}); err != nil {
			return err
		}
		if len(s.Dir.Glob) > 256 {
			return bad("dir.glob", "over 256 bytes")
		}
	}
	if s.Options != nil {
		if err := s.Options.Validate(); err != nil {
			return err
		}
	}
	return s.validateSkipped()
}

// validateSkipped checks a client's list of what it left out: bounded, each path a
// path, each reason a known one, the total no less than the list.
func (s *JobSubmit) validateSkipped() error {
	bad := badField
	if len(s.Skipped) == 0 && s.SkippedTotal == 0 {
		return nil
	}
	if s.Dir != nil {
		return badField("skipped", "only with items: a directory's skipped entries are the gateway's to list")
	}
	if len(s.Skipped) > MaxJobSkipsListed || s.SkippedTotal < len(s.Skipped) || s.SkippedTotal > 1<<30 {
		return bad("skipped", "%d entries listed of skipped_total %d: at most %d, and no more than the total", len(s.Skipped), s.SkippedTotal, MaxJobSkipsListed)
	}
	for i, k := range s.Skipped {
		if k.Path == "" {
			return bad("skipped", "entry %d has no path", i)
		}
		if err := checkPaths(field{"skipped", k.Path}); err != nil {
			return err
		}
		if !slices.Contains(JobSkipReasons, k.Reason) {
			return bad("skipped", "entry %d: unknown reason %q (reasons: %s)", i, k.Reason, strings.Join(JobSkipReasons, ", "))
		}
	}
	return nil
}

// DecodeJobResults reads a job.results reply with each result typed by the job's op (a
// *TagReply for tag, ...): decoding into JobResultsReply itself gives each Result as a
// generic map.
func DecodeJobResults(data []byte, asJSON bool) (*JobResultsReply, error) {
	if asJSON {
		return decodeJobResults[json.RawMessage](data, true, func(r json.RawMessage) []byte { return r })
	}
	return decodeJobResults[msgpack.RawMessage](data, false, func(r msgpack.RawMessage) []byte { return r })
}

func decodeJobResults[R any](data []byte, asJSON bool, raw func(R) []byte) (*JobResultsReply, error) {
	var in struct {
		Job     string `msgpack:"job" json:"job"`
		Op      string `msgpack:"op" json:"op"`
		Results []struct {
			Seq    uint64 `msgpack:"seq" json:"seq"`
			Index  int    `msgpack:"i" json:"i"`
			Path   string `msgpack:"path" json:"path"`
			Result R      `msgpack:"result" json:"result"`
			Error  *Error `msgpack:"error" json:"error"`
			Cached bool   `msgpack:"cached" json:"cached"`
		} `msgpack:"results" json:"results"`
		Next uint64 `msgpack:"next" json:"next"`
		More bool   `msgpack:"more" json:"more"`
	}
	if err := Decode(data, &in, asJSON); err != nil {
		return nil, err
	}
	out := &JobResultsReply{Job: in.Job, Op: in.Op, Next: in.Next, More: in.More, Results: make([]JobResult, len(in.Results))}
	for i, r := range in.Results {
		out.Results[i] = JobResult{Seq: r.Seq, Index: r.Index, Path: r.Path, Error: r.Error, Cached: r.Cached}
		if b := raw(r.Result); r.Error == nil && len(b) > 0 {
			v := NewReply(in.Op)
			if v == nil {
				return nil, Errorf(CodeBadRequest, "job results of unknown op %q", in.Op)
			}
			if err := Decode(b, v, asJSON); err != nil {
				return nil, err
			}
			out.Results[i].Result = v
		}
	}
	return out, nil
}
