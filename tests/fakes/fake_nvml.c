/*
 * A stand-in for the NVIDIA driver's libnvidia-ml.so.1. The real nvidia-ml-py package loads it with
 * ctypes exactly as it loads the driver's library, so everything above the C ABI is the production
 * code path: pynvml's handles (ctypes pointers), its structs and error classes, the NVML backend, the
 * exposition. Functions not defined here are "not found" to nvidia-ml-py, as on an old driver. Used by
 * tests/deploy/test_container.py (in a container), tests/test_nvml_real.py and bench/bench_cycle.py.
 *
 * Like the driver, it needs the device nodes the NVIDIA container runtime adds: nvmlInit fails with
 * DRIVER_NOT_LOADED without nvidiactl and NO_PERMISSION when it cannot be opened read-write, and the
 * GPUs are the nvidia<N> nodes present. The nodes are looked for in /dev, or in $FAKE_NVML_DEV_DIR.
 *
 * Readings are those of the Python simulator (gpu_exporter.backends.fake.backend.SimNvml) at a frozen moment,
 * computed with the same formulas in the same order, so one scenario gives the same values through both
 * (tests/unit/backends/nvidia/test_nvml_fidelity.py holds them to it). The scenario is read from the environment at each
 * nvmlInit; names are the library's exported symbols:
 *   FAKE_NVML_DEV_DIR    folder with nvidiactl and nvidia<N> (default /dev)
 *   FAKE_NVML_TIME       seconds since the simulator started, frozen (default 0)
 *   FAKE_NVML_SEED       the simulator's seed (default 0)
 *   FAKE_NVML_MIG        MIG instances on GPU 0 (default 0)
 *   FAKE_NVML_PROCESSES  compute processes per GPU (default 1)
 *   FAKE_NVML_THROTTLE   policy=share,... for nvmlDeviceGetViolationStatus (default 0=0.05,1=0.01)
 *   FAKE_NVML_COST_MS    symbol=ms,...: each such call blocks that long (a real sleep; ctypes has
 *                        released the GIL, as around the driver's nvmlDeviceGetPcieThroughput)
 *   FAKE_NVML_MISSING    symbol,...: answer FUNCTION_NOT_FOUND (a driver without them)
 *   FAKE_NVML_LOST       gpu,...: every call on these GPUs answers GPU_IS_LOST
 *   FAKE_NVML_FAIL       symbol[@gpu]=code,...: that call answers that NVML error code
 *   FAKE_NVML_XIDS       gpu:xid,...: XID events, delivered in order by nvmlEventSetWait_v2
 *   FAKE_NVML_HANG       file: while it exists, every call blocks (a driver that stopped answering),
 *                        looked for every 50 ms
 *   FAKE_NVML_LOG        file: one line per call, "symbol gpu tid start_ns end_ns return" (gpu -1: none;
 *                        times on CLOCK_MONOTONIC; tid the kernel's thread id)
 *   FAKE_NVML_BOARD      "" (default: data-centre GPUs, as above), or a Jetson's integrated GPU as its
 *                        NVML answers (board_presets below): "thor" (Jetson Thor, JetPack 7: the
 *                        nvidia.ko stack; name, PCI, utilization, codec use and the compute and
 *                        graphics process lists answer, memory, clocks, power, temperature and the rest
 *                        NOT_SUPPORTED) or "orin" (Orin on the L4T NVML: only the name and identity
 *                        answer, every reading NOT_SUPPORTED, processes included)
 *
 * Build: cc -shared -fPIC -ffp-contract=off -o libnvidia-ml.so.1 fake_nvml.c -lm
 * (no fused multiply-add, so that the arithmetic is Python's, operation by operation)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_MEMORY 20
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25

#define MAX_GPUS 64
#define MAX_MIG 7
#define MAX_RULES 96 /* a board preset takes up to 30 of them */
#define MAX_POLICIES 8
#define NAME_LEN 64
#define EVENT_SETS 8
#define NVML_MEMORY_V2 0x02000028u
#define NVML_GPM_METRICS_GET_VERSION 1u
#define XID_CRITICAL_ERROR 0x8ULL
#define GIB (1ULL << 30)

typedef struct {
    unsigned int index; /* the GPU (a MIG instance's parent) */
    int mig;            /* MIG slot, or -1 for the GPU itself */
} fake_device;

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct { unsigned long long referenceTime, violationTime; } nvmlViolationTime_t;
typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType;
    int nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
typedef struct { unsigned int pid; unsigned long long timeStamp; unsigned int smUtil, memUtil, encUtil, decUtil; } nvmlProcessUtilizationSample_t;
typedef struct { fake_device *device; unsigned long long eventType, eventData; unsigned int gpuInstanceId, computeInstanceId; } nvmlEventData_t;
typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;
typedef struct { int device; } gpm_sample; /* the GPU it was last taken on, or -1 */
typedef struct { const char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;
typedef struct { unsigned int metricId; int nvmlReturn; double value; nvmlGpmMetricInfo_t metricInfo; } nvmlGpmMetric_t;
typedef struct {
    unsigned int version, numMetrics;
    gpm_sample *sample1, *sample2;
    nvmlGpmMetric_t metrics[];
} nvmlGpmMetricsGet_t;
typedef struct { int used; unsigned long long types[MAX_GPUS]; } event_set;

/* the scenario (read at nvmlInit) */
static struct { char name[NAME_LEN]; unsigned int ms; } costs[MAX_RULES];
static struct { char name[NAME_LEN]; int gpu; int code; } fails[MAX_RULES];
static char missing[MAX_RULES][NAME_LEN];
static struct { unsigned int gpu; unsigned long long xid; } xids[MAX_RULES];
static unsigned int n_costs, n_fails, n_missing, n_xids, next_xid;
static const char *hang_path; /* FAKE_NVML_HANG */
static int lost[MAX_GPUS];
static double elapsed, throttle[MAX_POLICIES];
static int throttled[MAX_POLICIES];
static int seed, processes_per_gpu;
static unsigned int mig_count;
static int log_fd = -1;
enum { BOARD_DATACENTRE, BOARD_THOR, BOARD_ORIN };
static int board;

static fake_device gpus[MAX_GPUS];
static fake_device migs[MAX_MIG];
static unsigned int gpu_count;
static int initialised;
static event_set event_sets[EVENT_SETS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static const char *env(const char *name, const char *fallback) {
    const char *value = getenv(name);
    return value != NULL && *value ? value : fallback;
}

/* "a=1,b@2=3": calls item(key, value) per entry; key is what precedes '=' (or the whole entry) */
static void each_item(const char *list, void (*item)(const char *key, const char *value)) {
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", list);
    for (char *save = NULL, *entry = strtok_r(copy, ",", &save); entry; entry = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(entry, '=');
        if (eq) *eq = '\0';
        item(entry, eq ? eq + 1 : "");
    }
}

static void add_cost(const char *key, const char *value) {
    if (n_costs == MAX_RULES) return;
    snprintf(costs[n_costs].name, NAME_LEN, "%s", key);
    costs[n_costs++].ms = (unsigned int)strtoul(value, NULL, 10);
}

static void add_fail(const char *key, const char *value) {
    if (n_fails == MAX_RULES) return;
    const char *at = strchr(key, '@');
    size_t length = at ? (size_t)(at - key) : strlen(key);
    snprintf(fails[n_fails].name, NAME_LEN, "%.*s", (int)length, key);
    fails[n_fails].gpu = at ? atoi(at + 1) : -1;
    fails[n_fails++].code = atoi(value);
}

static void add_missing(const char *key, const char *value) {
    (void)value;
    if (n_missing < MAX_RULES) snprintf(missing[n_missing++], NAME_LEN, "%s", key);
}

static void add_lost(const char *key, const char *value) {
    (void)value;
    int gpu = atoi(key);
    if (gpu >= 0 && gpu < MAX_GPUS) lost[gpu] = 1;
}

static void add_throttle(const char *key, const char *value) {
    int policy = atoi(key);
    if (policy < 0 || policy >= MAX_POLICIES) return;
    throttled[policy] = 1;
    throttle[policy] = strtod(value, NULL);
}

static void add_xid(const char *key, const char *value) {
    (void)value;
    const char *colon = strchr(key, ':');
    if (colon == NULL || n_xids == MAX_RULES) return;
    xids[n_xids].gpu = (unsigned int)atoi(key);
    xids[n_xids++].xid = strtoull(colon + 1, NULL, 10);
}

/* What a Jetson's NVML answers NOT_SUPPORTED (code 3), from what monitoring tools report: on Thor
 * (JetPack 7, nvidia.ko) nvidia-smi and pynvml give the name, utilization, codec use and the process
 * lists, and N/A for memory, clocks, power and temperature; on Orin (L4T NVML over nvgpu) NVML names the
 * GPU "Orin (nvgpu)" and supports none of the readings. docs/vendors.md cites the sources. */
static const char THOR_UNSUPPORTED[] =
    "nvmlDeviceGetMemoryInfo=3,nvmlDeviceGetMemoryInfo_v2=3,nvmlDeviceGetTemperature=3,"
    "nvmlDeviceGetPowerUsage=3,nvmlDeviceGetEnforcedPowerLimit=3,nvmlDeviceGetTotalEnergyConsumption=3,"
    "nvmlDeviceGetClockInfo=3,nvmlDeviceGetMaxClockInfo=3,nvmlDeviceGetPerformanceState=3,"
    "nvmlDeviceGetCurrentClocksEventReasons=3,nvmlDeviceGetViolationStatus=3,nvmlDeviceGetPcieThroughput=3,"
    "nvmlDeviceGetPcieReplayCounter=3,nvmlDeviceGetCurrPcieLinkGeneration=3,nvmlDeviceGetCurrPcieLinkWidth=3,"
    "nvmlDeviceGetTotalEccErrors=3,nvmlDeviceGetRemappedRows=3,nvmlDeviceGetFieldValues=3,"
    "nvmlDeviceGetMigMode=3,nvmlGpmQueryDeviceSupport=3,nvmlDeviceGetProcessUtilization=3,nvmlDeviceGetSerial=3";
static const char ORIN_UNSUPPORTED[] =
    "nvmlDeviceGetUtilizationRates=3,nvmlDeviceGetEncoderUtilization=3,nvmlDeviceGetDecoderUtilization=3,"
    "nvmlDeviceGetComputeRunningProcesses_v3=3,nvmlDeviceGetComputeRunningProcesses_v2=3,"
    "nvmlDeviceGetGraphicsRunningProcesses_v3=3,nvmlDeviceGetPciInfo_v3=3";

static void read_board(void) {
    const char *name = env("FAKE_NVML_BOARD", "");
    board = strcmp(name, "thor") == 0 ? BOARD_THOR : strcmp(name, "orin") == 0 ? BOARD_ORIN : BOARD_DATACENTRE;
    if (board != BOARD_DATACENTRE) each_item(THOR_UNSUPPORTED, add_fail);
    if (board == BOARD_ORIN) each_item(ORIN_UNSUPPORTED, add_fail);
}

static void read_scenario(void) {
    n_costs = n_fails = n_missing = n_xids = next_xid = 0;
    memset(lost, 0, sizeof lost);
    memset(throttled, 0, sizeof throttled);
    elapsed = strtod(env("FAKE_NVML_TIME", "0"), NULL);
    seed = atoi(env("FAKE_NVML_SEED", "0"));
    mig_count = (unsigned int)atoi(env("FAKE_NVML_MIG", "0"));
    if (mig_count > MAX_MIG) mig_count = MAX_MIG;
    processes_per_gpu = atoi(env("FAKE_NVML_PROCESSES", "1"));
    each_item(env("FAKE_NVML_THROTTLE", "0=0.05,1=0.01"), add_throttle);
    each_item(env("FAKE_NVML_COST_MS", ""), add_cost);
    each_item(env("FAKE_NVML_FAIL", ""), add_fail);
    read_board(); /* after the scenario's own rules, which win where both name a call */
    each_item(env("FAKE_NVML_MISSING", ""), add_missing);
    each_item(env("FAKE_NVML_LOST", ""), add_lost);
    each_item(env("FAKE_NVML_XIDS", ""), add_xid);
    if (log_fd >= 0) close(log_fd);
    hang_path = env("FAKE_NVML_HANG", NULL);
    const char *log_path = env("FAKE_NVML_LOG", NULL);
    log_fd = log_path ? open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
}

/* -- every call: its cost, then the scenario's answer (missing > lost > failure), then a log line -- */

typedef struct {
    const char *name;
    int gpu;
    struct timespec started;
} call;

static long long nanoseconds(const struct timespec *t) { return (long long)t->tv_sec * 1000000000LL + t->tv_nsec; }

/* 0, or the error this call answers on GPU ``gpu`` (-1: a call without a device) */
static int begin(call *c, const char *name, int gpu) {
    c->name = name;
    c->gpu = gpu;
    clock_gettime(CLOCK_MONOTONIC, &c->started);
    if (hang_path != NULL) {
        struct timespec tick = {0, 50000000L};
        while (access(hang_path, F_OK) == 0) nanosleep(&tick, NULL);
    }
    for (unsigned int i = 0; i < n_costs; i++) {
        if (strcmp(costs[i].name, name) == 0 && costs[i].ms > 0) {
            struct timespec wait = {costs[i].ms / 1000, (long)(costs[i].ms % 1000) * 1000000L};
            while (nanosleep(&wait, &wait) != 0) {
            }
        }
    }
    for (unsigned int i = 0; i < n_missing; i++)
        if (strcmp(missing[i], name) == 0) return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (gpu >= 0 && lost[gpu]) return NVML_ERROR_GPU_IS_LOST;
    for (unsigned int i = 0; i < n_fails; i++)
        if (strcmp(fails[i].name, name) == 0 && (fails[i].gpu < 0 || fails[i].gpu == gpu)) return fails[i].code;
    return NVML_SUCCESS;
}

static int finish(const call *c, int ret) {
    if (log_fd >= 0) {
        struct timespec ended;
        char line[160];
        clock_gettime(CLOCK_MONOTONIC, &ended);
        int n = snprintf(line, sizeof line, "%s %d %ld %lld %lld %d\n", c->name, c->gpu, (long)syscall(SYS_gettid),
                         nanoseconds(&c->started), nanoseconds(&ended), ret);
        if (write(log_fd, line, (size_t)n) < 0) { /* a test reading the log will notice */
        }
    }
    return ret;
}

static fake_device *device_of(void *handle) {
    fake_device *device = (fake_device *)handle;
    if (device >= gpus && device < gpus + gpu_count) return device;
    if (device >= migs && device < migs + mig_count) return device;
    return NULL;
}

/* begin() for a call on a device: checks the library is up and the handle is one of ours */
static int begin_on(call *c, const char *name, void *handle, fake_device **device) {
    *device = initialised ? device_of(handle) : NULL;
    if (*device == NULL) {
        begin(c, name, -1);
        return initialised ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    }
    return begin(c, name, (int)(*device)->index);
}

/* the simulator's per-GPU signal: 0..1, smooth, different per GPU */
static double wave(const fake_device *d, double period, double phase) {
    return 0.5 + 0.5 * sin(elapsed / period + d->index * 1.7 + seed + phase);
}

static int is_mig_parent(const fake_device *d) { return mig_count > 0 && d->index == 0 && d->mig < 0; }
static int on_mig(const fake_device *d) { return d->mig >= 0 || is_mig_parent(d); }

static int copy_text(char *out, unsigned int length, const char *text) {
    if (out == NULL || strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

/* -- library ---------------------------------------------------------------------------------- */

int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    char path[4096];
    call c;
    read_scenario();
    int ret = begin(&c, "nvmlInitWithFlags", -1);
    if (ret) return finish(&c, ret);
    const char *dir = env("FAKE_NVML_DEV_DIR", "/dev");
    snprintf(path, sizeof path, "%s/nvidiactl", dir);
    if (access(path, F_OK) != 0) return finish(&c, NVML_ERROR_DRIVER_NOT_LOADED);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return finish(&c, NVML_ERROR_NO_PERMISSION);
    close(fd);
    gpu_count = 0;
    for (unsigned int minor = 0; minor < MAX_GPUS; minor++) {
        snprintf(path, sizeof path, "%s/nvidia%u", dir, minor);
        if (access(path, F_OK) == 0) {
            gpus[gpu_count].index = gpu_count;
            gpus[gpu_count].mig = -1;
            gpu_count++;
        }
    }
    if (gpu_count == 0) mig_count = 0;
    for (unsigned int slot = 0; slot < mig_count; slot++) {
        migs[slot].index = 0;
        migs[slot].mig = (int)slot;
    }
    memset(event_sets, 0, sizeof event_sets);
    initialised = 1;
    return finish(&c, NVML_SUCCESS);
}

int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

int nvmlShutdown(void) {
    call c;
    int ret = begin(&c, "nvmlShutdown", -1);
    if (ret == NVML_SUCCESS) initialised = 0;
    return finish(&c, ret);
}

const char *nvmlErrorString(int result) {
    switch (result) {
        case NVML_SUCCESS: return "Success";
        case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
        case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
        case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
        case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
        case NVML_ERROR_NOT_FOUND: return "Not Found";
        case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
        case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
        case NVML_ERROR_TIMEOUT: return "Timeout";
        case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
        case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
        case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
        default: return "Unknown Error";
    }
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    call c;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    int ret = begin(&c, "nvmlDeviceGetCount_v2", -1);
    if (ret == NVML_SUCCESS) *count = gpu_count;
    return finish(&c, ret);
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    call c;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    int ret = begin(&c, "nvmlSystemGetDriverVersion", -1);
    const char *text = board == BOARD_THOR ? "580.00" : board == BOARD_ORIN ? "595.78" : "550.54.15";
    return finish(&c, ret ? ret : copy_text(version, length, text));
}

int nvmlSystemGetCudaDriverVersion(int *version) {
    call c;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    int ret = begin(&c, "nvmlSystemGetCudaDriverVersion", -1);
    if (ret == NVML_SUCCESS) *version = board == BOARD_THOR ? 13000 : board == BOARD_ORIN ? 13020 : 12040;
    return finish(&c, ret);
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **handle) {
    call c;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    int ret = begin(&c, "nvmlDeviceGetHandleByIndex_v2", index < MAX_GPUS ? (int)index : -1);
    if (ret == NVML_SUCCESS && index >= gpu_count) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) *handle = &gpus[index];
    return finish(&c, ret);
}

/* -- identity --------------------------------------------------------------------------------- */

int nvmlDeviceGetIndex(void *handle, unsigned int *index) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetIndex", handle, &d);
    if (ret == NVML_SUCCESS) *index = d->index;
    return finish(&c, ret);
}

int nvmlDeviceGetUUID(void *handle, char *uuid, unsigned int length) {
    call c;
    fake_device *d;
    char text[96];
    int ret = begin_on(&c, "nvmlDeviceGetUUID", handle, &d);
    if (ret) return finish(&c, ret);
    if (d->mig >= 0)
        snprintf(text, sizeof text, "MIG-%04x%04x-%04x-4000-8000-00000000a1%02x", seed, d->index, d->mig, d->mig);
    else
        snprintf(text, sizeof text, "GPU-%08x-%04x-4000-8000-0000000000%02x", seed, d->index, d->index);
    return finish(&c, copy_text(uuid, length, text));
}

int nvmlDeviceGetName(void *handle, char *name, unsigned int length) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetName", handle, &d);
    if (ret) return finish(&c, ret);
    if (board != BOARD_DATACENTRE) return finish(&c, copy_text(name, length, board == BOARD_THOR ? "NVIDIA Thor" : "Orin (nvgpu)"));
    return finish(&c, copy_text(name, length, d->mig >= 0 ? "NVIDIA H100 80GB HBM3 MIG 1g.10gb" : "NVIDIA H100 80GB HBM3"));
}

int nvmlDeviceGetSerial(void *handle, char *serial, unsigned int length) {
    call c;
    fake_device *d;
    char text[32];
    int ret = begin_on(&c, "nvmlDeviceGetSerial", handle, &d);
    if (ret) return finish(&c, ret);
    snprintf(text, sizeof text, "16523%03d%05u", seed, d->index);
    return finish(&c, copy_text(serial, length, text));
}

int nvmlDeviceGetPciInfo_v3(void *handle, nvmlPciInfo_t *pci) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetPciInfo_v3", handle, &d);
    if (ret == NVML_SUCCESS) {
        memset(pci, 0, sizeof *pci);
        pci->bus = board == BOARD_THOR ? 0x01 : 0x18 + d->index * 0x10; /* Thor's GPU: 0000:01:00.0 */
        snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", pci->bus);
        snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", pci->bus);
    }
    return finish(&c, ret);
}

int nvmlDeviceGetMinorNumber(void *handle, unsigned int *minor) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetMinorNumber", handle, &d);
    if (ret == NVML_SUCCESS) *minor = d->index;
    return finish(&c, ret);
}

/* -- MIG -------------------------------------------------------------------------------------- */

int nvmlDeviceGetMigMode(void *handle, unsigned int *current, unsigned int *pending) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetMigMode", handle, &d);
    if (ret == NVML_SUCCESS) *current = *pending = (unsigned int)is_mig_parent(d);
    return finish(&c, ret);
}

int nvmlDeviceGetMaxMigDeviceCount(void *handle, unsigned int *count) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetMaxMigDeviceCount", handle, &d);
    if (ret == NVML_SUCCESS) *count = MAX_MIG;
    return finish(&c, ret);
}

int nvmlDeviceGetMigDeviceHandleByIndex(void *handle, unsigned int slot, void **mig) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetMigDeviceHandleByIndex", handle, &d);
    if (ret == NVML_SUCCESS && (!is_mig_parent(d) || slot >= mig_count)) ret = NVML_ERROR_NOT_FOUND;
    if (ret == NVML_SUCCESS) *mig = &migs[slot];
    return finish(&c, ret);
}

int nvmlDeviceGetGpuInstanceId(void *handle, unsigned int *id) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetGpuInstanceId", handle, &d);
    if (ret == NVML_SUCCESS) *id = 7 + (unsigned int)(d->mig >= 0 ? d->mig : 0);
    return finish(&c, ret);
}

int nvmlDeviceGetComputeInstanceId(void *handle, unsigned int *id) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetComputeInstanceId", handle, &d);
    if (ret == NVML_SUCCESS) *id = 0;
    return finish(&c, ret);
}

/* -- readings --------------------------------------------------------------------------------- */

int nvmlDeviceGetUtilizationRates(void *handle, nvmlUtilization_t *utilization) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetUtilizationRates", handle, &d);
    if (ret == NVML_SUCCESS && on_mig(d)) ret = NVML_ERROR_NOT_SUPPORTED;
    if (ret == NVML_SUCCESS) {
        double load = wave(d, 60, 0.0);
        utilization->gpu = (unsigned int)(100 * load);
        utilization->memory = (unsigned int)(60 * load);
    }
    return finish(&c, ret);
}

static int codec(const char *name, void *handle, unsigned int *util, unsigned int *period, double scale, double phase) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, name, handle, &d);
    if (ret == NVML_SUCCESS && on_mig(d)) ret = NVML_ERROR_NOT_SUPPORTED;
    if (ret == NVML_SUCCESS) {
        *util = (unsigned int)(scale * wave(d, 90, phase));
        *period = 167000;
    }
    return finish(&c, ret);
}

int nvmlDeviceGetEncoderUtilization(void *handle, unsigned int *util, unsigned int *period) {
    return codec("nvmlDeviceGetEncoderUtilization", handle, util, period, 10, 0.0);
}

int nvmlDeviceGetDecoderUtilization(void *handle, unsigned int *util, unsigned int *period) {
    return codec("nvmlDeviceGetDecoderUtilization", handle, util, period, 20, 1.0);
}

/* total, reserved and used bytes (the simulator's nvmlDeviceGetMemoryInfo) */
static void memory_of(const fake_device *d, unsigned long long *total, unsigned long long *reserved,
                      unsigned long long *used) {
    *total = d->mig < 0 ? 80 * GIB : 10 * GIB;
    *reserved = d->mig < 0 ? 512ULL * 1024 * 1024 : 0;
    double share = 0.1 + 0.8 * wave(d, 120, 0.5 + (d->mig >= 0 ? d->mig : 0));
    *used = (unsigned long long)((double)(*total - *reserved) * share);
    *used -= *used % 4096;
}

int nvmlDeviceGetMemoryInfo(void *handle, nvmlMemory_t *memory) {
    call c;
    fake_device *d;
    unsigned long long total, reserved, used;
    int ret = begin_on(&c, "nvmlDeviceGetMemoryInfo", handle, &d);
    if (ret == NVML_SUCCESS) {
        memory_of(d, &total, &reserved, &used);
        memory->total = total;
        memory->used = used;
        memory->free = total - reserved - used;
    }
    return finish(&c, ret);
}

int nvmlDeviceGetMemoryInfo_v2(void *handle, nvmlMemory_v2_t *memory) {
    call c;
    fake_device *d;
    unsigned long long total, reserved, used;
    int ret = begin_on(&c, "nvmlDeviceGetMemoryInfo_v2", handle, &d);
    if (ret == NVML_SUCCESS && memory->version != NVML_MEMORY_V2) ret = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (ret == NVML_SUCCESS) {
        memory_of(d, &total, &reserved, &used);
        memory->total = total;
        memory->reserved = reserved;
        memory->used = used;
        memory->free = total - reserved - used;
    }
    return finish(&c, ret);
}

int nvmlDeviceGetTemperature(void *handle, int sensor, unsigned int *celsius) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetTemperature", handle, &d);
    if (ret == NVML_SUCCESS && sensor != 0) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) *celsius = (unsigned int)(34 + 40 * wave(d, 120, 0.0));
    return finish(&c, ret);
}

int nvmlDeviceGetPowerUsage(void *handle, unsigned int *milliwatts) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetPowerUsage", handle, &d);
    if (ret == NVML_SUCCESS) *milliwatts = (unsigned int)(70000 + 550000 * wave(d, 60, 0.0));
    return finish(&c, ret);
}

int nvmlDeviceGetEnforcedPowerLimit(void *handle, unsigned int *milliwatts) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetEnforcedPowerLimit", handle, &d);
    if (ret == NVML_SUCCESS) *milliwatts = 700000;
    return finish(&c, ret);
}

int nvmlDeviceGetTotalEnergyConsumption(void *handle, unsigned long long *millijoules) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetTotalEnergyConsumption", handle, &d);
    if (ret == NVML_SUCCESS) /* mean power 345 W */
        *millijoules = (unsigned long long)(5000000000.0 + 345000 * elapsed + (double)(1000 * d->index));
    return finish(&c, ret);
}

static const unsigned int max_clocks[] = {1980, 1980, 2619, 1545};

int nvmlDeviceGetMaxClockInfo(void *handle, unsigned int type, unsigned int *mhz) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetMaxClockInfo", handle, &d);
    if (ret == NVML_SUCCESS && type > 3) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) *mhz = max_clocks[type];
    return finish(&c, ret);
}

int nvmlDeviceGetClockInfo(void *handle, unsigned int type, unsigned int *mhz) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetClockInfo", handle, &d);
    if (ret == NVML_SUCCESS && type > 3) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) {
        double load = wave(d, 60, 0.0);
        if (type <= 1) *mhz = (unsigned int)(345 + 1635 * load);
        else if (type == 2) *mhz = 2619;
        else *mhz = (unsigned int)(765 + 780 * load);
    }
    return finish(&c, ret);
}

int nvmlDeviceGetPerformanceState(void *handle, unsigned int *pstate) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetPerformanceState", handle, &d);
    if (ret == NVML_SUCCESS) *pstate = wave(d, 60, 0.0) > 0.1 ? 0 : 8;
    return finish(&c, ret);
}

int nvmlDeviceGetCurrentClocksEventReasons(void *handle, unsigned long long *reasons) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetCurrentClocksEventReasons", handle, &d);
    if (ret == NVML_SUCCESS) {
        double load = wave(d, 60, 0.0);
        *reasons = load < 0.1 ? 0x1 : (load > 0.9 ? 0x4 : 0);
    }
    return finish(&c, ret);
}

int nvmlDeviceGetViolationStatus(void *handle, unsigned int policy, nvmlViolationTime_t *status) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetViolationStatus", handle, &d);
    if (ret == NVML_SUCCESS && (d->mig >= 0 || policy >= MAX_POLICIES || !throttled[policy]))
        ret = NVML_ERROR_NOT_SUPPORTED;
    if (ret == NVML_SUCCESS) {
        status->referenceTime = (unsigned long long)(elapsed * 1e6);
        status->violationTime = (unsigned long long)(0.0 + elapsed * throttle[policy] * 1e9);
    }
    return finish(&c, ret);
}

int nvmlDeviceGetFanSpeed(void *handle, unsigned int *percent) {
    call c;
    fake_device *d;
    (void)percent;
    int ret = begin_on(&c, "nvmlDeviceGetFanSpeed", handle, &d);
    return finish(&c, ret ? ret : NVML_ERROR_NOT_SUPPORTED); /* a passively cooled data-centre card */
}

/* the driver samples the link for about 20 ms here: FAKE_NVML_COST_MS=nvmlDeviceGetPcieThroughput=20 */
int nvmlDeviceGetPcieThroughput(void *handle, unsigned int counter, unsigned int *kib_per_second) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetPcieThroughput", handle, &d);
    if (ret == NVML_SUCCESS && counter > 1) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) *kib_per_second = (unsigned int)(2000000 * wave(d, 30, counter));
    return finish(&c, ret);
}

static int fixed_uint(const char *name, void *handle, unsigned int *out, unsigned int value) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, name, handle, &d);
    if (ret == NVML_SUCCESS) *out = value;
    return finish(&c, ret);
}

int nvmlDeviceGetPcieReplayCounter(void *handle, unsigned int *count) {
    return fixed_uint("nvmlDeviceGetPcieReplayCounter", handle, count, 0);
}

int nvmlDeviceGetCurrPcieLinkGeneration(void *handle, unsigned int *generation) {
    return fixed_uint("nvmlDeviceGetCurrPcieLinkGeneration", handle, generation, 5);
}

int nvmlDeviceGetCurrPcieLinkWidth(void *handle, unsigned int *width) {
    return fixed_uint("nvmlDeviceGetCurrPcieLinkWidth", handle, width, 16);
}

int nvmlDeviceGetTotalEccErrors(void *handle, unsigned int error_type, unsigned int counter_type,
                                unsigned long long *count) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetTotalEccErrors", handle, &d);
    if (ret == NVML_SUCCESS) *count = error_type == 0 && counter_type == 1 ? 3 : 0;
    return finish(&c, ret);
}

int nvmlDeviceGetRemappedRows(void *handle, unsigned int *corr, unsigned int *unc, unsigned int *pending,
                              unsigned int *failure) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetRemappedRows", handle, &d);
    if (ret == NVML_SUCCESS) {
        *corr = 1;
        *unc = *pending = *failure = 0;
    }
    return finish(&c, ret);
}

int nvmlDeviceGetRetiredPages(void *handle, unsigned int cause, unsigned int *count, unsigned long long *pages) {
    call c;
    fake_device *d;
    (void)cause, (void)count, (void)pages;
    int ret = begin_on(&c, "nvmlDeviceGetRetiredPages", handle, &d);
    return finish(&c, ret ? ret : NVML_ERROR_NOT_SUPPORTED); /* Hopper remaps rows instead */
}

int nvmlDeviceGetFieldValues(void *handle, int count, nvmlFieldValue_t *values) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceGetFieldValues", handle, &d);
    if (ret) return finish(&c, ret);
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        memset(&v->value, 0, sizeof v->value);
        v->nvmlReturn = NVML_SUCCESS;
        v->valueType = 3; /* unsigned long long */
        if (v->fieldId == 82) { /* memory temperature */
            v->value.uiVal = (unsigned int)(40 + 30 * wave(d, 120, 0.0));
            v->valueType = 1;
        } else if (v->fieldId == 91) { /* NVLink link count */
            v->value.uiVal = 18;
            v->valueType = 1;
        } else if (v->fieldId == 138 || v->fieldId == 139) { /* NVLink data KiB, cumulative */
            v->value.ullVal = (unsigned long long)((double)(1000 + 10 * v->scopeId) * elapsed * (v->fieldId == 138 ? 2 : 3));
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return finish(&c, NVML_SUCCESS);
}

/* -- processes -------------------------------------------------------------------------------- */

/* graphics: the graphics list, which on Thor holds the first compute process again (a CUDA process
 * that also draws is in both lists there); none elsewhere */
static int running_processes(const char *name, void *handle, unsigned int *count, nvmlProcessInfo_t *infos, int graphics) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, name, handle, &d);
    if (ret) return finish(&c, ret);
    unsigned int key = d->mig < 0 ? d->index : 1000 + d->index * 10 + (unsigned int)d->mig;
    unsigned int n = is_mig_parent(d) ? 0 : (unsigned int)processes_per_gpu;
    if (graphics) n = board == BOARD_THOR && n > 0 ? 1 : 0;
    if (n == 0) {
        *count = 0;
        return finish(&c, NVML_SUCCESS);
    }
    if (infos == NULL || *count < n) {
        *count = n;
        return finish(&c, NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned int i = 0; i < n; i++) {
        infos[i].pid = 4000 + key * 10 + i;
        infos[i].usedGpuMemory = (2 + i) * GIB;
        infos[i].gpuInstanceId = infos[i].computeInstanceId = 0xFFFFFFFF;
    }
    *count = n;
    return finish(&c, NVML_SUCCESS);
}

int nvmlDeviceGetComputeRunningProcesses_v3(void *handle, unsigned int *count, nvmlProcessInfo_t *infos) {
    return running_processes("nvmlDeviceGetComputeRunningProcesses_v3", handle, count, infos, 0);
}

int nvmlDeviceGetComputeRunningProcesses_v2(void *handle, unsigned int *count, nvmlProcessInfo_t *infos) {
    return running_processes("nvmlDeviceGetComputeRunningProcesses_v2", handle, count, infos, 0);
}

int nvmlDeviceGetGraphicsRunningProcesses_v3(void *handle, unsigned int *count, nvmlProcessInfo_t *infos) {
    return running_processes("nvmlDeviceGetGraphicsRunningProcesses_v3", handle, count, infos, 1);
}

int nvmlDeviceGetProcessUtilization(void *handle, nvmlProcessUtilizationSample_t *samples, unsigned int *count,
                                    unsigned long long since) {
    call c;
    fake_device *d;
    (void)since;
    int ret = begin_on(&c, "nvmlDeviceGetProcessUtilization", handle, &d);
    if (ret == NVML_SUCCESS && on_mig(d)) ret = NVML_ERROR_NOT_SUPPORTED;
    if (ret == NVML_SUCCESS && processes_per_gpu <= 0) ret = NVML_ERROR_NOT_FOUND;
    if (ret) return finish(&c, ret);
    unsigned int n = (unsigned int)processes_per_gpu;
    if (samples == NULL || *count < n) {
        *count = n;
        return finish(&c, NVML_ERROR_INSUFFICIENT_SIZE);
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (unsigned int i = 0; i < n; i++) {
        memset(&samples[i], 0, sizeof samples[i]);
        samples[i].pid = 4000 + d->index * 10 + i;
        samples[i].smUtil = (unsigned int)(100 * wave(d, 60, 0.0)) / n;
        samples[i].timeStamp = (unsigned long long)now.tv_sec * 1000000ULL + (unsigned long long)now.tv_nsec / 1000;
    }
    *count = n;
    return finish(&c, NVML_SUCCESS);
}

/* -- GPM -------------------------------------------------------------------------------------- */

int nvmlGpmQueryDeviceSupport(void *handle, nvmlGpmSupport_t *support) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlGpmQueryDeviceSupport", handle, &d);
    if (ret == NVML_SUCCESS) support->isSupportedDevice = is_mig_parent(d) ? 0 : 1;
    return finish(&c, ret);
}

int nvmlGpmSampleAlloc(gpm_sample **sample) {
    call c;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    int ret = begin(&c, "nvmlGpmSampleAlloc", -1);
    if (ret == NVML_SUCCESS) {
        *sample = malloc(sizeof **sample);
        if (*sample == NULL) return finish(&c, NVML_ERROR_MEMORY);
        (*sample)->device = -1;
    }
    return finish(&c, ret);
}

int nvmlGpmSampleFree(gpm_sample *sample) {
    call c;
    int ret = begin(&c, "nvmlGpmSampleFree", -1);
    if (ret == NVML_SUCCESS) free(sample);
    return finish(&c, ret);
}

int nvmlGpmSampleGet(void *handle, gpm_sample *sample) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlGpmSampleGet", handle, &d);
    if (ret == NVML_SUCCESS && sample == NULL) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) sample->device = (int)d->index;
    return finish(&c, ret);
}

int nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *request) {
    call c;
    static const struct { unsigned int id; double share; } shares[] = {
        {2, 0.9}, {3, 0.5}, {5, 0.6}, {10, 0.7}, {11, 0.05}, {12, 0.3}, {13, 0.2},
    };
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    int gpu = request->sample2 != NULL ? request->sample2->device : -1;
    int ret = begin(&c, "nvmlGpmMetricsGet", gpu);
    if (ret == NVML_SUCCESS && (gpu < 0 || (unsigned int)gpu >= gpu_count)) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS && request->version != NVML_GPM_METRICS_GET_VERSION) ret = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (ret) return finish(&c, ret);
    double load = wave(&gpus[gpu], 60, 0.0);
    for (unsigned int i = 0; i < request->numMetrics; i++) {
        nvmlGpmMetric_t *metric = &request->metrics[i];
        metric->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        metric->value = 0.0;
        for (size_t k = 0; k < sizeof shares / sizeof shares[0]; k++) {
            if (shares[k].id == metric->metricId) {
                metric->value = 100.0 * load * shares[k].share;
                metric->nvmlReturn = NVML_SUCCESS;
            }
        }
    }
    return finish(&c, NVML_SUCCESS);
}

/* -- events (XID) ----------------------------------------------------------------------------- */

int nvmlEventSetCreate(event_set **set) {
    call c;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    int ret = begin(&c, "nvmlEventSetCreate", -1);
    if (ret) return finish(&c, ret);
    pthread_mutex_lock(&lock);
    ret = NVML_ERROR_MEMORY;
    for (int i = 0; i < EVENT_SETS; i++) {
        if (!event_sets[i].used) {
            memset(&event_sets[i], 0, sizeof event_sets[i]);
            event_sets[i].used = 1;
            *set = &event_sets[i];
            ret = NVML_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return finish(&c, ret);
}

int nvmlDeviceRegisterEvents(void *handle, unsigned long long types, event_set *set) {
    call c;
    fake_device *d;
    int ret = begin_on(&c, "nvmlDeviceRegisterEvents", handle, &d);
    if (ret == NVML_SUCCESS && (set == NULL || !set->used)) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) {
        pthread_mutex_lock(&lock);
        set->types[d->index] |= types;
        pthread_mutex_unlock(&lock);
    }
    return finish(&c, ret);
}

int nvmlEventSetWait_v2(event_set *set, nvmlEventData_t *data, unsigned int timeout_ms) {
    call c;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    int ret = begin(&c, "nvmlEventSetWait_v2", -1);
    if (ret == NVML_SUCCESS && (set == NULL || !set->used)) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret) return finish(&c, ret);
    pthread_mutex_lock(&lock);
    while (next_xid < n_xids) {
        unsigned int gpu = xids[next_xid].gpu;
        unsigned long long xid = xids[next_xid++].xid;
        if (gpu < gpu_count && (set->types[gpu] & XID_CRITICAL_ERROR)) {
            memset(data, 0, sizeof *data);
            data->device = &gpus[gpu];
            data->eventType = XID_CRITICAL_ERROR;
            data->eventData = xid;
            data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFF;
            pthread_mutex_unlock(&lock);
            return finish(&c, NVML_SUCCESS);
        }
    }
    pthread_mutex_unlock(&lock);
    struct timespec wait = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    while (nanosleep(&wait, &wait) != 0) {
    }
    return finish(&c, NVML_ERROR_TIMEOUT);
}

int nvmlEventSetFree(event_set *set) {
    call c;
    int ret = begin(&c, "nvmlEventSetFree", -1);
    if (ret == NVML_SUCCESS && set != NULL) {
        pthread_mutex_lock(&lock);
        set->used = 0;
        pthread_mutex_unlock(&lock);
    }
    return finish(&c, ret);
}
