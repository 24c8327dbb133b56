package onnxgen

// CPUOnlyGraph builds a model with a node ONNX Runtime's WebGPU EP has no kernel for
// (Det, which only the CPU EP implements in ORT 1.30) beside one it has (Mul): input "x"
// float [N,2,2] -> "y" float [N,2,2] = x*2 and "det" float [N] = Det(x). On a webgpu
// session with the CPU fallback on, Mul runs on webgpu and Det on the CPU.
func CPUOnlyGraph() *Graph {
	g := NewGraph("onnxgen_cpu_only")
	g.AddInput("x", Float, "N", 2, 2)
	g.AddOutput("y", Float, "N", 2, 2)
	g.AddOutput("det", Float, "N")
	g.AddNode("Mul", []string{"x", g.Scalar(2)}, []string{"y"})
	g.AddNode("Det", []string{"x"}, []string{"det"})
	return g
}

// CPUOnlyOp is the op of CPUOnlyGraph that runs on the CPU under the WebGPU EP.
const CPUOnlyOp = "Det"
