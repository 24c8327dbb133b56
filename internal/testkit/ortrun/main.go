// Command ortrun is a test-only oracle: it runs models directly with one ONNX Runtime
// library, through package ort alone (no NATS, gateway, worker, msgpack or request
// handling), and writes each output as a .npy file, so that a test can compare what the
// infer op returns with what the runtime itself gives, byte for byte, from a process of
// its own (one runtime per process).
//
//	ortrun -lib LIBRARY -spec SPEC.json
//
// SPEC is {"runs": [{"model": PATH, "inputs": {NAME: {"path": NPY}}, "out":
// DIR}]}: each run loads the model (one session for every run of the same path), reads
// each input from its .npy file, runs it, and writes into DIR (which must exist) one file
// NAME.npy per output the session returns and outputs.json, [{"name", "type", "shape",
// "file"}] in the model's output order (bfloat16 in '<V2' files, as npy reads and writes
// it). A run that fails writes
// error.txt into DIR instead; ortrun still runs the others. The exit status is 0 once every
// run has been tried, 1 when the spec or the library cannot be used, 2 on a usage error.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/npy"
	"github.com/ortbus/ortbus/ort"
)

// Spec is the runs to make.
type Spec struct {
	Runs []Run `json:"runs"`
}

// Run is one run of a model.
type Run struct {
	Model  string           `json:"model"`
	Inputs map[string]Input `json:"inputs"`
	Out    string           `json:"out"`
}

// Input is one input's .npy file.
type Input struct {
	Path string `json:"path"`
}

// Output is one output written, as outputs.json lists it.
type Output struct {
	Name  string  `json:"name"`
	Type  string  `json:"type"`
	Shape []int64 `json:"shape"`
	File  string  `json:"file"`
}

func main() {
	lib := flag.String("lib", "", "the ONNX Runtime library")
	specPath := flag.String("spec", "", "the runs, as JSON")
	flag.Parse()
	if *lib == "" || *specPath == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: ortrun -lib LIBRARY -spec SPEC.json")
		os.Exit(2)
	}
	b, err := os.ReadFile(*specPath)
	if err != nil {
		fatal(err)
	}
	var spec Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		fatal(fmt.Errorf("%s: %w", *specPath, err))
	}
	rt, err := ort.Load(*lib)
	if err != nil {
		fatal(err)
	}
	sessions := map[string]*ort.Session{}
	for _, r := range spec.Runs {
		if err := run(rt, sessions, r); err != nil {
			if werr := os.WriteFile(filepath.Join(r.Out, "error.txt"), []byte(err.Error()), 0o644); werr != nil {
				fatal(werr)
			}
		}
	}
	for _, s := range sessions {
		s.Close()
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "ortrun:", err)
	os.Exit(1)
}

func run(rt *ort.Runtime, sessions map[string]*ort.Session, r Run) error {
	s := sessions[r.Model]
	if s == nil {
		var err error
		if s, err = rt.NewSession(r.Model, ort.SessionConfig{IntraOpThreads: 1, InterOpThreads: 1}); err != nil {
			return err
		}
		sessions[r.Model] = s
	}
	var ins []ort.Tensor
	for name, in := range r.Inputs {
		b, err := os.ReadFile(in.Path)
		if err != nil {
			return err
		}
		t, err := npy.Decode(b)
		if err != nil {
			return fmt.Errorf("%s: %w", in.Path, err)
		}
		x, err := toOrt(t)
		if err != nil {
			return fmt.Errorf("input %s: %w", name, err)
		}
		x.Name = name
		ins = append(ins, x)
	}
	outs, err := s.Run(context.Background(), ins)
	if err != nil {
		return err
	}
	list := []Output{}
	for _, o := range outs {
		t, err := fromOrt(o)
		if err != nil {
			return err
		}
		b, err := npy.Encode(t)
		if err != nil {
			return fmt.Errorf("output %s: %w", o.Name, err)
		}
		file := filepath.Join(r.Out, o.Name+".npy")
		if err := os.WriteFile(file, b, 0o644); err != nil {
			return err
		}
		list = append(list, Output{Name: o.Name, Type: t.Type, Shape: t.Shape, File: file})
	}
	b, err := json.Marshal(list)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(r.Out, "outputs.json"), b, 0o644)
}

// toOrt is a tensor read from a file as ort's.
func toOrt(t *codec.Tensor) (ort.Tensor, error) {
	le := binary.LittleEndian
	x := ort.Tensor{Shape: t.Shape}
	n := 0
	if size := codec.ElemSize(t.Type); size > 0 {
		n = len(t.Data) / size
	}
	b := t.Data
	switch t.Type {
	case "float32":
		x.Data = each(n, func(i int) float32 { return math.Float32frombits(le.Uint32(b[4*i:])) })
	case "float64":
		x.Data = each(n, func(i int) float64 { return math.Float64frombits(le.Uint64(b[8*i:])) })
	case "float16":
		x.Data = ort.Float16(each(n, func(i int) uint16 { return le.Uint16(b[2*i:]) }))
	case "bfloat16":
		x.Data = ort.BFloat16(each(n, func(i int) uint16 { return le.Uint16(b[2*i:]) }))
	case "int64":
		x.Data = each(n, func(i int) int64 { return int64(le.Uint64(b[8*i:])) })
	case "int32":
		x.Data = each(n, func(i int) int32 { return int32(le.Uint32(b[4*i:])) })
	case "int16":
		x.Data = each(n, func(i int) int16 { return int16(le.Uint16(b[2*i:])) })
	case "int8":
		x.Data = each(n, func(i int) int8 { return int8(b[i]) })
	case "uint64":
		x.Data = each(n, func(i int) uint64 { return le.Uint64(b[8*i:]) })
	case "uint32":
		x.Data = each(n, func(i int) uint32 { return le.Uint32(b[4*i:]) })
	case "uint16":
		x.Data = each(n, func(i int) uint16 { return le.Uint16(b[2*i:]) })
	case "uint8":
		x.Data = append([]uint8{}, b...)
	case "bool":
		x.Data = each(n, func(i int) bool { return b[i] != 0 })
	case "string":
		x.Data = append([]string{}, t.Strings...)
	default:
		return x, fmt.Errorf("type %s", t.Type)
	}
	return x, nil
}

func each[T any](n int, f func(int) T) []T {
	v := make([]T, n)
	for i := range v {
		v[i] = f(i)
	}
	return v
}

// fromOrt is an output of ort as a tensor to write.
func fromOrt(o ort.Tensor) (*codec.Tensor, error) {
	le := binary.LittleEndian
	t := &codec.Tensor{Shape: append([]int64{}, o.Shape...)}
	switch d := o.Data.(type) {
	case []float32:
		t.Type, t.Data = "float32", put(d, 4, func(b []byte, v float32) { le.PutUint32(b, math.Float32bits(v)) })
	case []float64:
		t.Type, t.Data = "float64", put(d, 8, func(b []byte, v float64) { le.PutUint64(b, math.Float64bits(v)) })
	case ort.Float16:
		t.Type, t.Data = "float16", put(d, 2, le.PutUint16)
	case ort.BFloat16:
		t.Type, t.Data = "bfloat16", put(d, 2, le.PutUint16)
	case []int64:
		t.Type, t.Data = "int64", put(d, 8, func(b []byte, v int64) { le.PutUint64(b, uint64(v)) })
	case []int32:
		t.Type, t.Data = "int32", put(d, 4, func(b []byte, v int32) { le.PutUint32(b, uint32(v)) })
	case []int16:
		t.Type, t.Data = "int16", put(d, 2, func(b []byte, v int16) { le.PutUint16(b, uint16(v)) })
	case []int8:
		t.Type, t.Data = "int8", put(d, 1, func(b []byte, v int8) { b[0] = byte(v) })
	case []uint64:
		t.Type, t.Data = "uint64", put(d, 8, le.PutUint64)
	case []uint32:
		t.Type, t.Data = "uint32", put(d, 4, le.PutUint32)
	case []uint16:
		t.Type, t.Data = "uint16", put(d, 2, le.PutUint16)
	case []uint8:
		t.Type, t.Data = "uint8", append([]byte{}, d...)
	case []bool:
		t.Type, t.Data = "bool", put(d, 1, func(b []byte, v bool) {
			if v {
				b[0] = 1
			}
		})
	case []string:
		t.Type, t.Strings = "string", append([]string{}, d...)
	default:
		return nil, fmt.Errorf("output %s: data %T", o.Name, o.Data)
	}
	return t, nil
}

func put[T any](d []T, size int, f func([]byte, T)) []byte {
	b := make([]byte, size*len(d))
	for i, v := range d {
		f(b[size*i:], v)
	}
	return b
}
