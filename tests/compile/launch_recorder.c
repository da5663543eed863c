/* A recording stand-in for the CUDA runtime and driver, for tests only.
 *
 * tests/compile/test_launch_record.py links a bundle's kernel objects, its
 * glue (templates/link/glue.c.j2) and the release shim (templates/link/shim.c)
 * with this file in place of libcudart_static.a. It defines the CUDA-runtime
 * functions those call; the driver entry points of the shim (cuLaunchKernelEx,
 * cuKernelGetAttribute, cuDeviceGet) and of the glue's oversized-carveout
 * request (cuKernelSetAttribute, cuDeviceGetAttribute) come from
 * cudaGetDriverEntryPointByVersion as on a GPU machine. Nothing runs on a GPU: each call succeeds with the
 * device the test configured (tkrec_configure), and what the host code asked
 * for is appended to a log of JSON lines (tkrec_log): every kernel attribute
 * set, every occupancy query and every launch with its grid, block, dynamic
 * shared memory and launch attributes. It never ships in a bundle.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TKREC_EXPORT __attribute__((visibility("default")))
#define TKREC_LIBRARIES 4096

static int device_attributes[256];
static int occupancy_clusters;
static int static_smem_bytes;
static int current_device;
static char *log_text;
static size_t log_length, log_capacity;
/* One fake library per tk_init, each holding its one kernel: the handles are
 * addresses in this array, so a handle names its library. */
static char libraries[TKREC_LIBRARIES];
static int library_count;

static void record(const char *format, ...) {
  char line[1024];
  va_list args;
  va_start(args, format);
  int n = vsnprintf(line, sizeof line, format, args);
  va_end(args);
  if (n < 0) return;
  if (log_length + (size_t)n + 2 > log_capacity) {
    log_capacity = (log_length + (size_t)n + 2) * 2;
    log_text = realloc(log_text, log_capacity);
  }
  memcpy(log_text + log_length, line, (size_t)n);
  log_length += (size_t)n;
  log_text[log_length++] = '\n';
  log_text[log_length] = 0;
}

static int kernel_index(const void *handle) { return (int)((const char *)handle - libraries); }

/* The device the calls below describe: values[i] is cudaDeviceAttr i; `clusters` answers every
 * occupancy query; `static_smem` is the static shared memory of the kernel loaded next, as the
 * driver reads it from the cubin (CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES). */
TKREC_EXPORT void tkrec_configure(const int *values, int count, int clusters, int static_smem) {
  memset(device_attributes, 0, sizeof device_attributes);
  for (int i = 0; i < count && i < 256; ++i) device_attributes[i] = values[i];
  occupancy_clusters = clusters;
  static_smem_bytes = static_smem;
}

TKREC_EXPORT const char *tkrec_log(void) { return log_text ? log_text : ""; }

TKREC_EXPORT void tkrec_clear(void) { log_length = 0; if (log_text) log_text[0] = 0; }

cudaError_t cudaGetDeviceCount(int *count) { *count = 1; return cudaSuccess; }
cudaError_t cudaGetDevice(int *device) { *device = current_device; return cudaSuccess; }
cudaError_t cudaSetDevice(int device) { current_device = device; return cudaSuccess; }
cudaError_t cudaDriverGetVersion(int *version) { *version = CUDA_VERSION; return cudaSuccess; }
const char *cudaGetErrorName(cudaError_t error) { (void)error; return "tkrec"; }
const char *cudaGetErrorString(cudaError_t error) { (void)error; return "launch recorder"; }

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  (void)device;
  *value = (int)attr >= 0 && (int)attr < 256 ? device_attributes[attr] : 0;
  return cudaSuccess;
}

cudaError_t cudaLibraryLoadData(cudaLibrary_t *library, const void *code, enum cudaJitOption *jit_options,
                                void **jit_values, unsigned jit_count, enum cudaLibraryOption *lib_options,
                                void **lib_values, unsigned lib_count) {
  (void)code, (void)jit_options, (void)jit_values, (void)jit_count, (void)lib_options, (void)lib_values,
      (void)lib_count;
  if (library_count == TKREC_LIBRARIES) return cudaErrorMemoryAllocation;
  *library = (cudaLibrary_t)&libraries[library_count++];
  return cudaSuccess;
}

cudaError_t cudaLibraryGetKernel(cudaKernel_t *kernel, cudaLibrary_t library, const char *name) {
  *kernel = (cudaKernel_t)library;
  record("{\"event\": \"get_kernel\", \"kernel\": %d, \"name\": \"%s\"}", kernel_index(library), name);
  return cudaSuccess;
}

cudaError_t cudaLibraryGetKernelCount(unsigned int *count, cudaLibrary_t library) {
  (void)library;
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaLibraryEnumerateKernels(cudaKernel_t *kernels, unsigned int count, cudaLibrary_t library) {
  if (count) kernels[0] = (cudaKernel_t)library;
  return cudaSuccess;
}

cudaError_t cudaKernelSetAttributeForDevice(cudaKernel_t kernel, enum cudaFuncAttribute attr, int value,
                                            int device) {
  record("{\"event\": \"kernel_attribute\", \"kernel\": %d, \"attribute\": %d, \"value\": %d, \"device\": %d}",
         kernel_index(kernel), (int)attr, value, device);
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
  record("{\"event\": \"kernel_attribute\", \"kernel\": %d, \"attribute\": %d, \"value\": %d, \"device\": -1}",
         kernel_index(func), (int)attr, value);
  return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveClusters(int *count, const void *func, const cudaLaunchConfig_t *config) {
  unsigned x = 0, y = 0, z = 0;
  for (unsigned i = 0; i < config->numAttrs; ++i)
    if (config->attrs[i].id == cudaLaunchAttributeClusterDimension) {
      x = config->attrs[i].val.clusterDim.x, y = config->attrs[i].val.clusterDim.y,
      z = config->attrs[i].val.clusterDim.z;
    }
  record("{\"event\": \"occupancy\", \"kernel\": %d, \"block\": [%u, %u, %u], \"dynamic_smem\": %zu, "
         "\"cluster\": [%u, %u, %u]}", kernel_index(func), config->blockDim.x, config->blockDim.y,
         config->blockDim.z, config->dynamicSmemBytes, x, y, z);
  *count = occupancy_clusters;
  return cudaSuccess;
}

static void record_launch(const char *path, const void *kernel, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned by, unsigned bz, size_t smem, const CUlaunchAttribute *attrs, unsigned count) {
  char list[512] = "";
  size_t used = 0;
  for (unsigned i = 0; i < count && used < sizeof list - 96; ++i) {
    const CUlaunchAttribute *a = &attrs[i];
    const char *sep = i ? ", " : "";
    if (a->id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
      used += (size_t)snprintf(list + used, sizeof list - used, "%s{\"id\": %d, \"cluster\": [%u, %u, %u]}", sep,
                               (int)a->id, a->value.clusterDim.x, a->value.clusterDim.y, a->value.clusterDim.z);
    else
      used += (size_t)snprintf(list + used, sizeof list - used, "%s{\"id\": %d, \"value\": %u}", sep, (int)a->id,
                               a->value.programmaticStreamSerializationAllowed);
  }
  record("{\"event\": \"launch\", \"path\": \"%s\", \"kernel\": %d, \"grid\": [%u, %u, %u], \"block\": [%u, %u, %u], "
         "\"dynamic_smem\": %zu, \"attributes\": [%s]}", path, kernel_index(kernel), gx, gy, gz, bx, by, bz, smem,
         list);
}

/* The shim's launch path: the driver's cuLaunchKernelEx. */
static CUresult launch_kernel_ex(const CUlaunchConfig *config, CUfunction kernel, void **params, void **extra) {
  (void)params, (void)extra;
  record_launch("driver", kernel, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                config->blockDimY, config->blockDimZ, config->sharedMemBytes, config->attrs, config->numAttrs);
  return CUDA_SUCCESS;
}

/* The shim's fallback path, which a launch should never take. */
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *kernel, void **args) {
  (void)args;
  record_launch("runtime", kernel, config->gridDim.x, config->gridDim.y, config->gridDim.z, config->blockDim.x,
                config->blockDim.y, config->blockDim.z, config->dynamicSmemBytes,
                (const CUlaunchAttribute *)config->attrs, config->numAttrs);
  return cudaSuccess;
}

static CUresult kernel_get_attribute(int *value, CUfunction_attribute attr, CUkernel kernel, CUdevice device) {
  record("{\"event\": \"get_kernel_attribute\", \"kernel\": %d, \"attribute\": %d, \"device\": %d}",
         kernel_index(kernel), (int)attr, (int)device);
  *value = attr == CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES ? static_smem_bytes : 0;
  return CUDA_SUCCESS;
}

static CUresult kernel_set_attribute(CUfunction_attribute attr, int value, CUkernel kernel, CUdevice device) {
  record("{\"event\": \"kernel_attribute\", \"kernel\": %d, \"attribute\": %d, \"value\": %d, \"device\": %d, "
         "\"driver\": true}", kernel_index(kernel), (int)attr, value, (int)device);
  return CUDA_SUCCESS;
}

/* The driver's device attributes are the runtime's numbers: the same configured values. */
static CUresult device_get_attribute(int *value, CUdevice_attribute attr, CUdevice device) {
  record("{\"event\": \"device_attribute\", \"attribute\": %d, \"device\": %d}", (int)attr, (int)device);
  *value = (int)attr >= 0 && (int)attr < 256 ? device_attributes[attr] : 0;
  return CUDA_SUCCESS;
}

static CUresult device_get(CUdevice *device, int ordinal) {
  *device = ordinal;
  return CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **function, unsigned int version,
                                             unsigned long long flags, enum cudaDriverEntryPointQueryResult *status) {
  (void)version, (void)flags;
  *function = !strcmp(symbol, "cuLaunchKernelEx")       ? (void *)launch_kernel_ex
              : !strcmp(symbol, "cuKernelGetAttribute") ? (void *)kernel_get_attribute
              : !strcmp(symbol, "cuDeviceGet")          ? (void *)device_get
              : !strcmp(symbol, "cuKernelSetAttribute") ? (void *)kernel_set_attribute
              : !strcmp(symbol, "cuDeviceGetAttribute") ? (void *)device_get_attribute
                                                        : 0;
  if (status) *status = *function ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  record("{\"event\": \"entry_point\", \"symbol\": \"%s\", \"found\": %s}", symbol, *function ? "true" : "false");
  return *function ? cudaSuccess : cudaErrorSymbolNotFound;
}
