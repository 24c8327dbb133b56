// Package ort is the only package of ortbus that imports onnxruntime_go. It finds and
// loads one ONNX Runtime shared library per process, appends execution providers with
// fresh session options for each attempt, and runs sessions that are safe to share
// between goroutines.
//
// One process holds at most one runtime: a second Load with another library fails, which
// is why every pool is its own worker process.
package ort
