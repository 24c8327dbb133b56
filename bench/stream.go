package bench

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
)

// Live audio streams through Silero VAD v5 (a class with arrival = "stream", model vad).
//
// Each stream is 16 kHz mono audio generated from the scenario's seed and the stream's
// number, cut into frames of 512 samples (32 ms). Frame k is due at start + k*interval
// and its deadline is its due time + the class's timeout (in collision-real.toml both
// are 32 ms: a frame's deadline is its period). The model's recurrent state goes from
// each reply (stateN) into the next frame's request (state), so a stream has one frame
// in flight at a time: frame k is sent when both its due time has come and frame k-1's
// answer has arrived (never before its due time; later when the answer to k-1 comes
// after it). Its request's timeout_ms is what is left until its deadline (rounded up to
// a whole millisecond), so the gateway drops it, answering deadline_exceeded, rather
// than serve it late. A frame whose deadline has passed (less than 1 ms left) before it
// can be sent is not sent: the client drops it ("skipped"), as a live client drops audio
// it can no longer process in time. When a frame gets no result the next one goes with
// the last state received. Each input is the frame's 512 samples after the previous
// frame's last 64 (576 samples, as silero-vad's OnnxWrapper and vad-web feed v5), and
// sr is the int64 scalar 16000.
//
// A frame is on time when its result arrives by its deadline; every other frame is
// dropped: skipped, answered deadline_exceeded (expired), a result after the deadline
// (late), another error, or no answer. Latency is counted from the frame's due time,
// not from when it was sent.
const (
	vadRate    = 16000
	vadFrame   = 512
	vadContext = 64
	vadState   = 2 * 128
	// vadInput, vadStateIn, vadSR, vadOutput and vadStateOut are the model's tensors.
	vadInput    = "input"
	vadStateIn  = "state"
	vadSR       = "sr"
	vadOutput   = "output"
	vadStateOut = "stateN"
	// codeSkipped marks a frame the client dropped without sending it.
	codeSkipped = "skipped"
)

// vadAudioPerFrame is the audio one frame carries: 512 samples at 16 kHz, 32 ms.
const vadAudioPerFrame = time.Duration(vadFrame) * time.Second / vadRate

// StreamStats are the audio streams' figures of a stream class in one run.
type StreamStats struct {
	Streams int `json:"streams"`
	// Frames are the frames due in the window (all streams); Sent those sent.
	Frames int `json:"frames"`
	Sent   int `json:"sent"`
	// OnTime are results by their deadline; Dropped every other frame, of which
	// Skipped (not sent: the deadline had passed), Expired (deadline_exceeded), Late
	// (a result after the deadline), Errors (other answers) and Unanswered.
	OnTime          int     `json:"on_time"`
	Dropped         int     `json:"dropped"`
	DroppedFraction float64 `json:"dropped_fraction"`
	Skipped         int     `json:"skipped"`
	Expired         int     `json:"expired"`
	Late            int     `json:"late"`
	Errors          int     `json:"errors"`
	Unanswered      int     `json:"unanswered"`
	// AudioS is the audio the frames carry: frames * 32 ms.
	AudioS float64 `json:"audio_s"`
	// RTF is the real-time factor: the sum over the sent frames of the time from the
	// client's send to its receipt of the answer, over AudioS. Under 1 the system answers
	// a stream faster than the audio comes. RTFCompute is the same with the model's own
	// run time (the results' timing.infer_us) in place of the round trip.
	RTF        float64 `json:"rtf"`
	RTFCompute float64 `json:"rtf_compute"`
	// SpeechFraction is the fraction of results whose speech probability is above 0.5
	// (the generated audio is tones, noise bursts and near-silence; this only shows that
	// the model answered with real values).
	SpeechFraction float64 `json:"speech_fraction"`
}

// frameRec is one frame of a stream and its outcome.
type frameRec struct {
	Stream, Index int
	Due, Deadline time.Time
	Sent          time.Time // zero: skipped
	Recv          time.Time
	Done          bool
	Code          string // "" = a result
	QueueUS       int64
	InferUS       int64
	Speech        float32
	Pool          string // the pool that served it
}

// frameSend is when a frame is sent: at its due time, or when the previous frame's
// answer arrives if that is later; skip when less than a millisecond would be left
// until its deadline then.
func frameSend(due, prevAnswer, deadline time.Time) (at time.Time, skip bool) {
	at = due
	if prevAnswer.After(at) {
		at = prevAnswer
	}
	return at, deadline.Sub(at) < time.Millisecond
}

// frameTimeoutMS is a frame's request timeout_ms when sent at at: what is left until its
// deadline, rounded up to a whole millisecond.
func frameTimeoutMS(at, deadline time.Time) int64 {
	left := deadline.Sub(at)
	return max(1, int64((left+time.Millisecond-1)/time.Millisecond))
}

// onTime reports whether the frame's result arrived by its deadline.
func (f *frameRec) onTime() bool {
	return f.Done && f.Code == "" && !f.Recv.After(f.Deadline)
}

// asCall is the frame as a call of the class's statistics: sent at its due time (its
// latency counts from there), with its deadline relative to that.
func (f *frameRec) asCall(class string) call {
	return call{Class: class, Sent: f.Due, Deadline: f.Deadline.Sub(f.Due), Done: f.Done, Recv: f.Recv, Code: f.Code, QueueUS: f.QueueUS, Pool: f.Pool}
}

// streamStats summarises the frames of a class's streams.
func streamStats(frames []frameRec, streams int) *StreamStats {
	s := &StreamStats{Streams: streams, Frames: len(frames)}
	var inFlight, compute time.Duration
	results, speech := 0, 0
	for i := range frames {
		f := &frames[i]
		if !f.Sent.IsZero() {
			s.Sent++
			if f.Done {
				inFlight += f.Recv.Sub(f.Sent)
			}
		}
		switch {
		case !f.Done:
			s.Unanswered++
		case f.Code == codeSkipped:
			s.Skipped++
		case f.Code == string(codec.CodeDeadlineExceeded):
			s.Expired++
		case f.Code != "":
			s.Errors++
		default:
			results++
			compute += time.Duration(f.InferUS) * time.Microsecond
			if f.Speech > 0.5 {
				speech++
			}
			if !f.onTime() {
				s.Late++
			}
		}
		if f.onTime() {
			s.OnTime++
		}
	}
	s.Dropped = s.Frames - s.OnTime
	audio := time.Duration(s.Frames) * vadAudioPerFrame
	s.AudioS = round(audio.Seconds(), 3)
	if s.Frames > 0 {
		s.DroppedFraction = round(float64(s.Dropped)/float64(s.Frames), 4)
		s.RTF = round(inFlight.Seconds()/audio.Seconds(), 4)
		s.RTFCompute = round(compute.Seconds()/audio.Seconds(), 4)
	}
	if results > 0 {
		s.SpeechFraction = round(float64(speech)/float64(results), 3)
	}
	return s
}

// streamAudio is stream i's audio for frames frames (plus nothing: the first frame's
// context is silence): from the seed, segments of 0.3 to 1.5 s, each near-silence (white
// noise at 0.003), a voiced tone (a harmonic series on 90 to 280 Hz with a 4 Hz
// syllable-like envelope) or a noise burst (white noise at 0.2).
func streamAudio(seed uint64, stream, frames int) []float32 {
	rng := rand.New(rand.NewPCG(seed, 1000+uint64(stream)))
	out := make([]float32, frames*vadFrame)
	for i := 0; i < len(out); {
		n := min(len(out)-i, int((0.3+1.2*rng.Float64())*vadRate))
		kind := rng.IntN(3)
		f0 := 90 + 190*rng.Float64()
		phase := rng.Float64() * 2 * math.Pi
		for j := 0; j < n; j++ {
			t := float64(j) / vadRate
			var v float64
			switch kind {
			case 0:
				v = 0.003 * (rng.Float64()*2 - 1)
			case 1:
				env := 0.5 + 0.5*math.Sin(2*math.Pi*4*t+phase)
				for h := 1; h <= 8; h++ {
					v += math.Sin(2*math.Pi*f0*float64(h)*t) / float64(h)
				}
				v = 0.15*env*v + 0.003*(rng.Float64()*2-1)
			default:
				v = 0.2 * (rng.Float64()*2 - 1)
			}
			out[i+j] = float32(v)
		}
		i += n
	}
	return out
}

// vadRequest is one frame's request: input [1, 576] (the previous frame's last 64
// samples, then the frame's 512), state [2, 1, 128], sr the int64 scalar 16000.
func vadRequest(model, class string, context, frame, state []float32) codec.Request {
	x := make([]float32, 0, vadContext+vadFrame)
	x = append(append(x, context...), frame...)
	return codec.Request{Model: model, Class: class, Inputs: map[string]*codec.Tensor{
		vadInput:   {Type: "float32", Shape: []int64{1, vadContext + vadFrame}, Data: codec.Float32Bytes(x)},
		vadStateIn: {Type: "float32", Shape: []int64{2, 1, 128}, Data: codec.Float32Bytes(state)},
		vadSR:      {Type: "int64", Shape: []int64{}, Data: []byte{vadRate & 0xff, vadRate >> 8, 0, 0, 0, 0, 0, 0}},
	}}
}

// runStreams runs n streams of class c from start, each with frames frames, and returns
// every frame's record once the last answer is in (or ctx ends).
func runStreams(ctx context.Context, cl *client.Client, c ScenarioClass, seed uint64, n, frames int, start time.Time) []frameRec {
	var mu sync.Mutex
	var all []frameRec
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		audio := streamAudio(seed, i, frames)
		wg.Go(func() {
			recs := runStream(ctx, cl, c, i, audio, start)
			mu.Lock()
			all = append(all, recs...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return all
}

// runStream runs one stream (see the top of this file).
func runStream(ctx context.Context, cl *client.Client, c ScenarioClass, stream int, audio []float32, start time.Time) []frameRec {
	period, timeout := c.Interval.D(), c.Timeout.D()
	state := make([]float32, vadState)
	prevTail := make([]float32, vadContext)
	frames := len(audio) / vadFrame
	recs := make([]frameRec, 0, frames)
	var prevAnswer time.Time
	for k := 0; k < frames; k++ {
		due := start.Add(c.Start.D() + time.Duration(k)*period)
		f := frameRec{Stream: stream, Index: k, Due: due, Deadline: due.Add(timeout)}
		frame := audio[k*vadFrame : (k+1)*vadFrame]
		tail := prevTail
		prevTail = frame[vadFrame-vadContext:]
		if sleepUntil(ctx, due) != nil {
			return recs
		}
		at, skip := frameSend(due, prevAnswer, f.Deadline)
		if now := time.Now(); now.After(at) {
			at = now
			skip = f.Deadline.Sub(at) < time.Millisecond
		}
		if skip {
			f.Done, f.Recv, f.Code = true, at, codeSkipped
			recs = append(recs, f)
			continue
		}
		req := vadRequest(c.Model, c.Name, tail, frame, state)
		req.ID, req.TimeoutMS = nuid.Next(), frameTimeoutMS(at, f.Deadline)
		// The gateway answers by the deadline; the client waits longer, to see it do so.
		cctx, cancel := context.WithDeadline(ctx, f.Deadline.Add(5*time.Second))
		f.Sent = time.Now()
		r, err := cl.Infer(cctx, req)
		f.Recv = time.Now()
		cancel()
		prevAnswer = f.Recv
		f.Done = true
		if err != nil {
			if ctx.Err() != nil {
				f.Done = false
				recs = append(recs, f)
				return recs
			}
			f.Code = errCode(err)
		} else {
			f.QueueUS, f.InferUS, f.Pool = r.Timing.QueueUS, r.Timing.InferUS, r.Pool
			if st := r.Outputs[vadStateOut]; st != nil {
				if v, err := codec.BytesFloat32(st.Data); err == nil && len(v) == vadState {
					state = v
				} else {
					f.Code = "bad_reply"
				}
			} else {
				f.Code = "bad_reply"
			}
			if o := r.Outputs[vadOutput]; o != nil {
				if v, err := codec.BytesFloat32(o.Data); err == nil && len(v) == 1 {
					f.Speech = v[0]
				}
			}
		}
		recs = append(recs, f)
	}
	return recs
}
