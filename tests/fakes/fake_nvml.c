/*
 * A stand-in for the NVIDIA driver's libnvidia-ml.so.1, for the container-faithful test
 * (tests/test_container.py). The real nvidia-ml-py package loads it with ctypes exactly as it loads the
 * driver's library, so everything above the C ABI is the production code path: the NVML backend, its
 * error handling, the exposition. Functions not defined here are "not found" to nvidia-ml-py, as on an
 * old driver.
 *
 * Like the driver, it needs the device nodes the NVIDIA container runtime adds: nvmlInit fails with
 * DRIVER_NOT_LOADED without /dev/nvidiactl and NO_PERMISSION when it cannot be opened read-write, and
 * the GPUs are the /dev/nvidia<N> nodes present. Readings are fixed, plausible values.
 *
 * Build: cc -shared -fPIC -o libnvidia-ml.so.1 fake_nvml.c
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define MAX_GPUS 8

typedef struct {
    unsigned int index;
} fake_device;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

static fake_device devices[MAX_GPUS];
static unsigned int device_count;
static int initialised;

static int copy_text(char *out, unsigned int length, const char *text) {
    if (out == NULL || strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

static fake_device *device_of(void *handle) {
    fake_device *device = (fake_device *)handle;
    if (!initialised || device < devices || device >= devices + device_count) return NULL;
    return device;
}

int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (access("/dev/nvidiactl", F_OK) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    int fd = open("/dev/nvidiactl", O_RDWR);
    if (fd < 0) return NVML_ERROR_NO_PERMISSION;
    close(fd);
    device_count = 0;
    for (unsigned int minor = 0; minor < MAX_GPUS; minor++) {
        char path[32];
        snprintf(path, sizeof path, "/dev/nvidia%u", minor);
        if (access(path, F_OK) == 0) {
            devices[device_count].index = device_count;
            device_count++;
        }
    }
    initialised = 1;
    return NVML_SUCCESS;
}

int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

int nvmlShutdown(void) {
    initialised = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(int result) {
    switch (result) {
        case NVML_SUCCESS: return "Success";
        case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
        case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
        case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
        case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
        case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
        default: return "Unknown Error";
    }
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *count = device_count;
    return NVML_SUCCESS;
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return initialised ? copy_text(version, length, "550.54.15") : NVML_ERROR_UNINITIALIZED;
}

int nvmlSystemGetCudaDriverVersion(int *version) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *version = 12040;
    return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **handle) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (index >= device_count) return NVML_ERROR_INVALID_ARGUMENT;
    *handle = &devices[index];
    return NVML_SUCCESS;
}

int nvmlDeviceGetIndex(void *handle, unsigned int *index) {
    fake_device *device = device_of(handle);
    if (device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *index = device->index;
    return NVML_SUCCESS;
}

int nvmlDeviceGetUUID(void *handle, char *uuid, unsigned int length) {
    fake_device *device = device_of(handle);
    char text[64];
    if (device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(text, sizeof text, "GPU-5a1b2c3d-0000-4000-8000-00000000000%u", device->index);
    return copy_text(uuid, length, text);
}

int nvmlDeviceGetName(void *handle, char *name, unsigned int length) {
    if (device_of(handle) == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    return copy_text(name, length, "NVIDIA A2");
}

int nvmlDeviceGetUtilizationRates(void *handle, nvmlUtilization_t *utilization) {
    fake_device *device = device_of(handle);
    if (device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    utilization->gpu = 37 + device->index;
    utilization->memory = 12;
    return NVML_SUCCESS;
}

int nvmlDeviceGetMemoryInfo_v2(void *handle, nvmlMemory_v2_t *memory) {
    if (device_of(handle) == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = 16ULL << 30;
    memory->reserved = 256ULL << 20;
    memory->used = 5ULL << 30;
    memory->free = memory->total - memory->reserved - memory->used;
    return NVML_SUCCESS;
}

int nvmlDeviceGetTemperature(void *handle, int sensor, unsigned int *celsius) {
    if (device_of(handle) == NULL || sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *celsius = 48;
    return NVML_SUCCESS;
}

int nvmlDeviceGetPowerUsage(void *handle, unsigned int *milliwatts) {
    if (device_of(handle) == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *milliwatts = 41500;
    return NVML_SUCCESS;
}

int nvmlDeviceGetEnforcedPowerLimit(void *handle, unsigned int *milliwatts) {
    if (device_of(handle) == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *milliwatts = 60000;
    return NVML_SUCCESS;
}

/* Every driver since 510 has the _v3 list; nvidia-ml-py refuses to fall back to older ones. */
int nvmlDeviceGetComputeRunningProcesses_v3(void *handle, unsigned int *count, void *infos) {
    (void)infos;
    if (device_of(handle) == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}
