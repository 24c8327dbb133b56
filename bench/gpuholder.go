package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/ort"
)

// The GPU memory holder (issue 41, item 7): `ortbus bench mem-holder -ep webgpu -runtime
// LIB -bytes N` holds N bytes of the GPU's memory, as an LLM server with its model loaded
// does, and gives them back on SIGUSR1. The memory is the initializers of a generated
// model (chunks of gpuHolderChunk bytes, each read by a Gather, so that no one buffer
// passes a device's binding limit) in an ONNX Runtime session on the WebGPU EP, run once
// so that they are on the device, their nodes checked to have run there (ORT's own
// placement report: with its CPU fallback on, a Gather it did not take would hold host
// memory instead). The session lives in a child process of the holder's (`-child`): its
// exit frees the device memory whatever ONNX Runtime and Dawn cache in a process, so on
// SIGUSR1 the holder kills the child and reports the kill as the start of the freeing
// and the child's reaping as its end. The lease's wrapper gives the holder's pid; the
// gateway measures the holder's process tree on the device (nvidia-smi for cuda:N, the
// DRM fdinfo for drm:N, resident memory for the cpu and lavapipe).

// gpuHolderChunk is one initializer's size.
const gpuHolderChunk = 64 << 20

// gpuHolderGraph is the holder's model for n bytes: input "i" int64 [1], output "y" float
// [1], the sum of Gather(c_k, i) over the chunks c_k (n bytes of float32 in all, rounded
// up to whole floats).
func gpuHolderGraph(n int64) *onnxgen.Graph {
	g := onnxgen.NewGraph("ortbus_gpu_holder")
	g.AddInput("i", onnxgen.Int64, 1)
	g.AddOutput("y", onnxgen.Float, 1)
	sum := ""
	for k := 0; n > 0; k++ {
		size := min(n, gpuHolderChunk)
		n -= size
		data := make([]float32, (size+3)/4)
		for j := range data {
			data[j] = float32(j%251) / 251 // not a constant a runtime could fold
		}
		c := g.AddFloat(fmt.Sprint("c", k), []int64{int64(len(data))}, data)
		got := g.Op("Gather", []string{c, "i"}, onnxgen.AttrInt("axis", 0))
		if sum == "" {
			sum = got
		} else {
			sum = g.Op("Add", []string{sum, got})
		}
	}
	g.AddNode("Identity", []string{sum}, []string{"y"})
	return g
}

// gpuHolderMain is the holder with -ep webgpu: the child started, its ready relayed, and
// on SIGUSR1 the child killed and reaped (freed). It returns the exit status.
func gpuHolderMain(n int64, lib string, stdout, stderr io.Writer, sigs <-chan os.Signal) int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "bench mem-holder: %v\n", err)
		return 1
	}
	child := exec.Command(self, "bench", "mem-holder", "-child", "-ep", "webgpu", "-runtime", lib, "-bytes", strconv.FormatInt(n, 10))
	child.Stderr = stderr
	child.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := child.StdoutPipe()
	if err == nil {
		err = child.Start()
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench mem-holder: the child: %v\n", err)
		return 1
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		var ev MemHolderEvent
		ready <- sc.Scan() && json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Event == MemHolderReady
		io.Copy(io.Discard, out)
	}()
	reaped := make(chan error, 1)
	select {
	case ok := <-ready:
		if !ok {
			child.Process.Kill()
			fmt.Fprintf(stderr, "bench mem-holder: the child did not get ready: %v\n", child.Wait())
			return 1
		}
	case <-sigs:
		child.Process.Kill()
		child.Wait()
		return 0
	}
	go func() { reaped <- child.Wait() }()
	say := json.NewEncoder(stdout)
	say.Encode(MemHolderEvent{Event: MemHolderReady, Bytes: n, PID: os.Getpid(), UnixUS: time.Now().UnixMicro()})
	freed := false
	for {
		select {
		case err := <-reaped:
			if !freed {
				fmt.Fprintf(stderr, "bench mem-holder: the child exited: %v\n", err)
				return 1
			}
			reaped = nil
		case s := <-sigs:
			if s != syscall.SIGUSR1 {
				if !freed {
					child.Process.Kill()
					<-reaped
				}
				return 0
			}
			if freed {
				continue
			}
			start := time.Now().UnixMicro()
			child.Process.Kill()
			<-reaped
			reaped, freed = nil, true
			say.Encode(MemHolderEvent{Event: MemHolderFreed, Bytes: n, PID: os.Getpid(), StartUnixUS: start, UnixUS: time.Now().UnixMicro()})
		}
	}
}

// gpuHolderChild is `-child`: the session made and run once on the WebGPU EP, its nodes
// checked to be there, ready printed; then it waits to be killed.
func gpuHolderChild(n int64, lib string, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "bench mem-holder -child: %v\n", err)
		return 1
	}
	rt, err := ort.Load(lib)
	if err != nil {
		return fail(err)
	}
	dir, err := os.MkdirTemp("", "ortbus-gpu-holder-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	model := filepath.Join(dir, "model.onnx")
	if err := gpuHolderGraph(n).WriteFile(model); err != nil {
		return fail(err)
	}
	s, err := rt.NewSession(model, ort.SessionConfig{Providers: []ort.Provider{{Name: "webgpu"}}, IntraOpThreads: 1, InterOpThreads: 1, Placement: true})
	if err != nil {
		return fail(err)
	}
	defer s.Close()
	if err := gpuHolderRun(s); err != nil {
		return fail(err)
	}
	// Read: its directory goes now, while the memory is held, since the holder ends
	// this child with a kill that runs no deferred call.
	os.RemoveAll(dir)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	json.NewEncoder(stdout).Encode(MemHolderEvent{Event: MemHolderReady, Bytes: n, PID: os.Getpid(), UnixUS: time.Now().UnixMicro()})
	<-stop // its holder kills it
	return 0
}

// gpuHolderRun runs the holder's session once and checks that its nodes ran on webgpu.
func gpuHolderRun(s *ort.Session) error {
	if s.EP != "webgpu" {
		return fmt.Errorf("the session runs on %s, not webgpu", s.EP)
	}
	if _, err := s.Run(context.Background(), []ort.Tensor{{Name: "i", Shape: []int64{1}, Data: []int64{0}}}); err != nil {
		return err
	}
	p, err := s.Placement()
	if err != nil {
		return err
	}
	if off := p.Off("webgpu"); len(off) > 0 || p.NodesByEP["webgpu"] == 0 {
		return fmt.Errorf("the holder's nodes did not all run on webgpu: %v off it, %d on it", off, p.NodesByEP["webgpu"])
	}
	return nil
}
