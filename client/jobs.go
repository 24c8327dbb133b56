package client

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// SubmitJob submits a job (see codec.JobSubmit): op over a list of paths or a directory.
// Sending the same submit again with the same Job id adds nothing.
func (c *Client) SubmitJob(ctx context.Context, req *codec.JobSubmit) (*codec.JobSubmitReply, error) {
	var r codec.JobSubmitReply
	return &r, c.do(ctx, subjects.OpJobSubmit, req, &r)
}

// JobStatus reads a job's counts and state.
func (c *Client) JobStatus(ctx context.Context, job string) (*codec.JobStatus, error) {
	var r codec.JobStatus
	return &r, c.do(ctx, subjects.OpJobStatus, &codec.JobRef{Job: job}, &r)
}

// CancelJob cancels a job: its waiting items are removed and its running ones stopped.
func (c *Client) CancelJob(ctx context.Context, job string) (*codec.JobStatus, error) {
	var r codec.JobStatus
	return &r, c.do(ctx, subjects.OpJobCancel, &codec.JobRef{Job: job}, &r)
}

// PauseJob pauses a job until ResumeJob: its running items finish, no other starts.
func (c *Client) PauseJob(ctx context.Context, job string) (*codec.JobStatus, error) {
	var r codec.JobStatus
	return &r, c.do(ctx, subjects.OpJobPause, &codec.JobRef{Job: job}, &r)
}

// ResumeJob lets a paused job's items run again.
func (c *Client) ResumeJob(ctx context.Context, job string) (*codec.JobStatus, error) {
	var r codec.JobStatus
	return &r, c.do(ctx, subjects.OpJobResume, &codec.JobRef{Job: job}, &r)
}

// ListJobs lists the jobs still kept, newest first.
func (c *Client) ListJobs(ctx context.Context) (*codec.JobListReply, error) {
	var r codec.JobListReply
	return &r, c.do(ctx, subjects.OpJobList, struct{}{}, &r)
}

// JobResults reads one page of a job's results from sequence from (0: the start).
func (c *Client) JobResults(ctx context.Context, job string, from uint64, limit int) (*codec.JobResultsReply, error) {
	var raw rawReply
	if err := c.do(ctx, subjects.OpJobResults, &codec.JobResultsRequest{Job: job, From: from, Limit: limit}, &raw); err != nil {
		return nil, err
	}
	return codec.DecodeJobResults(raw.data, raw.asJSON)
}

// EachJobResult calls fn with every result the job has recorded so far, in the order
// they were recorded, page by page; it stops at fn's first error.
func (c *Client) EachJobResult(ctx context.Context, job string, fn func(*codec.JobResult) error) error {
	var from uint64
	for {
		page, err := c.JobResults(ctx, job, from, 0)
		if err != nil {
			return err
		}
		for i := range page.Results {
			if err := fn(&page.Results[i]); err != nil {
				return err
			}
		}
		if !page.More {
			return nil
		}
		from = page.Next
	}
}

// WatchJob calls fn with the job's status every interval until the job is finished
// (then it returns that status) or ctx ends. Errors that say the gateway is briefly
// gone (no responders, a timeout, unavailable) are retried: a job outlives gateways.
func (c *Client) WatchJob(ctx context.Context, job string, interval time.Duration, fn func(*codec.JobStatus)) (*codec.JobStatus, error) {
	for {
		rctx, cancel := context.WithTimeout(ctx, max(interval, 5*time.Second))
		st, err := c.JobStatus(rctx, job)
		cancel()
		switch {
		case err == nil:
			if fn != nil {
				fn(st)
			}
			if st.Finished() {
				return st, nil
			}
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case !transient(err):
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(interval):
		}
	}
}

// transient reports whether err says the gateway is briefly not there, not that the
// request is wrong.
func transient(err error) bool {
	switch codec.CodeOf(err) {
	case codec.CodeNoWorker, codec.CodeUnavailable, codec.CodeOverloaded:
		return true
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders)
}

// rawReply keeps a reply's body undecoded (Decode fills it), for replies whose decoding
// depends on their content.
type rawReply struct {
	data   []byte
	asJSON bool
}
