/* The eight CUDA-runtime entry points an exported CuTe DSL object imports.
 *
 * NVIDIA's libcuda_dialect_runtime_static.a defines them as tail calls into the
 * CUDA runtime; these are written from the public CUDA headers instead, so a
 * bundle carries no CUTLASS DSL binary. Linked with libcudart_static.a, the
 * bundle library needs only libc and the driver, which cudart opens at run
 * time. _cuKernelGetAttribute takes a device ordinal where the driver wants a
 * CUdevice, so it converts through cuDeviceGet, resolved from the driver via
 * cudaGetDriverEntryPointByVersion (no link-time libcuda dependency).
 */
#include <cuda.h>
#include <cuda_runtime.h>

cudaError_t _cudaLibraryLoadData(cudaLibrary_t *library, const void *code,
                                 enum cudaJitOption *jit_options, void **jit_values, unsigned jit_count,
                                 enum cudaLibraryOption *lib_options, void **lib_values, unsigned lib_count) {
  return cudaLibraryLoadData(library, code, jit_options, jit_values, jit_count, lib_options, lib_values,
                             lib_count);
}

cudaError_t _cudaLibraryGetKernel(cudaKernel_t *kernel, cudaLibrary_t library, const char *name) {
  return cudaLibraryGetKernel(kernel, library, name);
}

cudaError_t _cudaLaunchKernelEx(const cudaLaunchConfig_t *config, const void *kernel, void **args) {
  return cudaLaunchKernelExC(config, kernel, args);
}

cudaError_t _cudaGetDevice(int *device) { return cudaGetDevice(device); }

cudaError_t _cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  return cudaDeviceGetAttribute(value, attr, device);
}

cudaError_t _cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(func, attr, value);
}

cudaError_t _cudaKernelSetAttributeForDevice(cudaKernel_t kernel, enum cudaFuncAttribute attr, int value,
                                             int device) {
  return cudaKernelSetAttributeForDevice(kernel, attr, value, device);
}

typedef CUresult (*kernel_get_attribute_fn)(int *, CUfunction_attribute, CUkernel, CUdevice);
typedef CUresult (*device_get_fn)(CUdevice *, int);

CUresult _cuKernelGetAttribute(int *value, CUfunction_attribute attr, CUkernel kernel, int ordinal) {
  static kernel_get_attribute_fn get_attribute;
  static device_get_fn device_get;
  enum cudaDriverEntryPointQueryResult found;
  if (!get_attribute &&
      (cudaGetDriverEntryPointByVersion("cuKernelGetAttribute", (void **)&get_attribute, 12000,
                                        cudaEnableDefault, &found) != cudaSuccess || !get_attribute))
    return CUDA_ERROR_NOT_FOUND;
  if (!device_get &&
      (cudaGetDriverEntryPointByVersion("cuDeviceGet", (void **)&device_get, 12000, cudaEnableDefault,
                                        &found) != cudaSuccess || !device_get))
    return CUDA_ERROR_NOT_FOUND;
  CUdevice device;
  CUresult status = device_get(&device, ordinal);
  return status != CUDA_SUCCESS ? status : get_attribute(value, attr, kernel, device);
}
