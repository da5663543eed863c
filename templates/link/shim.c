/* The eight CUDA-runtime entry points an exported CuTe DSL object imports.
 *
 * NVIDIA's libcuda_dialect_runtime_static.a defines them as tail calls into the
 * CUDA runtime; these are written from the public CUDA headers instead, so a
 * bundle carries no CUTLASS DSL binary. Linked with libcudart_static.a, the
 * bundle library needs only libc and the driver, which cudart opens at run
 * time. _cuKernelGetAttribute takes a device ordinal where the driver wants a
 * CUdevice, so it converts through cuDeviceGet, resolved from the driver via
 * cudaGetDriverEntryPointByVersion (no link-time libcuda dependency).
 *
 * _cudaLaunchKernelEx, the one call on the launch path, goes straight to the
 * driver's cuLaunchKernelEx: cudaKernel_t is a CUkernel, the two launch
 * attribute types share one layout (checked below), and a non-null stream
 * names its own context. Whatever the driver refuses (a thread with no
 * current context on the legacy stream, a bad configuration) is retried
 * through cudaLaunchKernelExC, which sets the context up and reports the
 * error as a cudaError_t; tk_fallback_launches() counts those retries.
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

_Static_assert(sizeof(cudaLaunchAttribute) == sizeof(CUlaunchAttribute), "launch attribute layouts differ");
_Static_assert((int)cudaLaunchAttributeClusterDimension == (int)CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
               "launch attribute ids differ");
_Static_assert((int)cudaLaunchAttributeClusterSchedulingPolicyPreference ==
                   (int)CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
               "launch attribute ids differ");
_Static_assert((int)cudaLaunchAttributeProgrammaticStreamSerialization ==
                   (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
               "launch attribute ids differ");

typedef CUresult (*launch_kernel_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);

static launch_kernel_ex_fn driver_launch;
static int driver_launch_resolved;
static unsigned long long fallback_launches;

static launch_kernel_ex_fn resolve_driver_launch(void) {
  if (__atomic_load_n(&driver_launch_resolved, __ATOMIC_ACQUIRE)) return driver_launch;
  void *fn = 0;
  enum cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion("cuLaunchKernelEx", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess)
    fn = 0;
  driver_launch = (launch_kernel_ex_fn)fn; /* every racing thread stores the same value */
  __atomic_store_n(&driver_launch_resolved, 1, __ATOMIC_RELEASE);
  return driver_launch;
}

cudaError_t _cudaLaunchKernelEx(const cudaLaunchConfig_t *config, const void *kernel, void **args) {
  launch_kernel_ex_fn launch = resolve_driver_launch();
  if (launch) {
    CUlaunchConfig driver_config = {
        config->gridDim.x, config->gridDim.y, config->gridDim.z,
        config->blockDim.x, config->blockDim.y, config->blockDim.z,
        (unsigned int)config->dynamicSmemBytes, (CUstream)config->stream,
        (CUlaunchAttribute *)config->attrs, config->numAttrs};
    if (launch(&driver_config, (CUfunction)kernel, args, 0) == CUDA_SUCCESS) return cudaSuccess;
  }
  __atomic_add_fetch(&fallback_launches, 1, __ATOMIC_RELAXED);
  return cudaLaunchKernelExC(config, kernel, args);
}

__attribute__((visibility("default"))) unsigned long long tk_fallback_launches(void) {
  return __atomic_load_n(&fallback_launches, __ATOMIC_RELAXED);
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
