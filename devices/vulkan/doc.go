// Package vulkan probes Vulkan as ONNX Runtime's WebGPU EP (Dawn over Vulkan on Linux)
// would see it in this process: the loader (libvulkan.so.1, dlopen()ed at run time, so
// neither the Vulkan headers nor the library are needed to build), the driver (ICD)
// manifests the loader would read, and the adapters it lists, with the one Dawn picks.
// It never touches ONNX Runtime; doctor, bench and the tests' environment checks use it.
package vulkan
