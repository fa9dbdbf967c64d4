/* A stand-in libnvidia-ml.so.1 for benchmarks on machines without a GPU (not used by the package or
 * its tests): STUB_NVML_GPUS (default 8) H100-like GPUs behind the NVML C functions the node agent
 * calls, each call charging what it costs on a real H100 (driver 580.159.04, measured: see
 * ../../docs/performance.md). Loaded by the real pynvml, so the agent runs its real-NVML path:
 * pynvml's Python wrappers and ctypes are timed, where the Python fake (fake_nvml.py) replaces them.
 *
 *   gcc -O2 -shared -fPIC -o DIR/libnvidia-ml.so.1 stub_nvml.c && LD_LIBRARY_PATH=DIR otel-gpu agent
 *
 * Values are plausible, not a model: utilization follows a slow wave per GPU, power follows it, the
 * energy counter integrates power, PCIe and NVLink rates follow utilization. No MIG, no processes,
 * no XID events. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
enum { OK = 0, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, INSUFFICIENT_SIZE = 7, TIMEOUT = 10 };
#define MAX_GPUS 64
#define NVLINKS 18

typedef struct gpu { unsigned index; double energy_mj, energy_t; double nvlink_kib[2], nvlink_t; } gpu_t;
typedef gpu_t *nvmlDevice_t;
static gpu_t gpus[MAX_GPUS];
static unsigned ngpus;

/* ---- costs (seconds of thread CPU spun, seconds asleep), per call, as measured on the H100 ---- */
static double now_s(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static void spend(double cpu_s, double sleep_s) {
    if (sleep_s > 0) {
        struct timespec ts = {(time_t)sleep_s, (long)((sleep_s - (time_t)sleep_s) * 1e9)};
        nanosleep(&ts, NULL);
    }
    double end = now_s(CLOCK_THREAD_CPUTIME_ID) + cpu_s;
    while (now_s(CLOCK_THREAD_CPUTIME_ID) < end) {}
}
#define CHEAP() spend(1e-6, 0)              /* utilization, power, temperature, clocks, reasons: ~1 us */

static double util(const gpu_t *g) {         /* 0..1, a slow wave per GPU */
    return 0.5 + 0.45 * sin(now_s(CLOCK_MONOTONIC) / 7.0 + g->index);
}
static double power_w(const gpu_t *g) { return 70.0 + 600.0 * util(g); }

/* ---- init, system, devices ---- */
nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    const char *n = getenv("STUB_NVML_GPUS");
    ngpus = n ? (unsigned)atoi(n) : 8;
    if (ngpus > MAX_GPUS) ngpus = MAX_GPUS;
    double t = now_s(CLOCK_MONOTONIC);
    for (unsigned i = 0; i < ngpus; i++) gpus[i] = (gpu_t){i, 1e9 + i * 1e6, t, {0, 0}, t};
    return OK;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
        case NOT_SUPPORTED: return "Not Supported";
        case INVALID_ARGUMENT: return "Invalid Argument";
        case TIMEOUT: return "Timeout";
        default: return "Unknown Error";
    }
}
nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned len) { snprintf(v, len, "580.159.04"); return OK; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { *n = ngpus; return OK; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) {
    if (i >= ngpus) return INVALID_ARGUMENT;
    *d = &gpus[i];
    return OK;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *s, unsigned len) {
    snprintf(s, len, "GPU-57ab0000-0000-4000-8000-%012x", d->index);
    return OK;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *s, unsigned len) {
    (void)d; snprintf(s, len, "NVIDIA H100 80GB HBM3"); return OK;
}
nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned *a) { (void)d; *a = 9; return OK; }
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned *cur, unsigned *pend) {
    (void)d; *cur = 0; *pend = 0; return OK;
}
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned *is) { (void)d; *is = 0; return OK; }
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned *n) { (void)d; *n = 0; return NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned i, nvmlDevice_t *m) {
    (void)d; (void)i; (void)m; return NOT_SUPPORTED;
}

/* ---- the round's readings ---- */
typedef struct { unsigned gpu, memory; } nvmlUtilization_t;
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    CHEAP();
    double x = util(d);
    u->gpu = (unsigned)lround(100 * x);
    u->memory = (unsigned)lround(12 * x);
    return OK;
}
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
static const unsigned long long MEM_TOTAL = 81559ULL << 20;
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    spend(7e-6, 0);
    m->total = MEM_TOTAL;
    m->used = (unsigned long long)(MEM_TOTAL * (0.02 + 0.75 * util(d)));
    m->free = m->total - m->used;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    nvmlMemory_t v1;
    nvmlDeviceGetMemoryInfo(d, &v1);
    m->total = v1.total; m->reserved = 0; m->free = v1.free; m->used = v1.used;
    return OK;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned *mw) {
    CHEAP(); *mw = (unsigned)(power_w(d) * 1000); return OK;
}
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned *mw) { (void)d; CHEAP(); *mw = 700000; return OK; }
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
    spend(4.02e-3, 0.05e-3);                 /* 4.07 ms wall, 4.02 ms CPU on the H100 */
    double t = now_s(CLOCK_MONOTONIC);
    d->energy_mj += power_w(d) * 1000 * (t - d->energy_t);
    d->energy_t = t;
    *mj = (unsigned long long)d->energy_mj;
    return OK;
}
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned *c) {
    CHEAP();
    if (sensor != 0) return NOT_SUPPORTED;
    *c = (unsigned)lround(30 + 40 * util(d));
    return OK;
}
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned *mhz) {
    CHEAP();
    *mhz = type == 2 ? 2619 : (util(d) > 0.05 ? 1980 : 345);   /* NVML_CLOCK_MEM = 2 */
    return OK;
}
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, int type, unsigned *mhz) {   /* read every 10 s */
    (void)d; CHEAP(); *mhz = type == 2 ? 2619 : 1980; return OK;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *mask) {
    CHEAP(); *mask = util(d) <= 0.05 ? 0x1 : (power_w(d) > 0.97 * 700 ? 0x4 : 0); return OK;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *mask) {
    return nvmlDeviceGetCurrentClocksEventReasons(d, mask);
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter, unsigned long long *n) {
    (void)d; (void)type; (void)counter; CHEAP(); *n = 0; return OK;
}
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned *kbs) {
    spend(0.79e-3, 20.1e-3);                 /* it samples for 20 ms: 20.9 ms wall, 0.79 ms CPU */
    *kbs = (unsigned)((counter == 0 ? 9000 : 19000) + 250000 * util(d) * (counter == 0 ? 0.6 : 1.0));
    return OK;
}

/* ---- health, read every 10 s: a healthy Hopper at Gen5 x16 (costs not measured on the H100: charged as
 * the cheap calls); page retirement is NOT_SUPPORTED there, as on every GPU since Ampere ---- */
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned *corr, unsigned *unc, unsigned *pending, unsigned *failed) {
    (void)d; CHEAP(); *corr = *unc = *pending = *failed = 0; return OK;
}
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t d, int cause, unsigned *count, unsigned long long *pages) {
    (void)d; (void)cause; (void)count; (void)pages; CHEAP(); return NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t d, unsigned link, int counter, unsigned long long *n) {
    (void)d; (void)counter; CHEAP();
    if (link >= NVLINKS) return INVALID_ARGUMENT;
    *n = 0; return OK;
}
nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t d, unsigned *n) { (void)d; CHEAP(); *n = 0; return OK; }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t d, unsigned *g) { (void)d; CHEAP(); *g = 5; return OK; }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t d, unsigned *g) { (void)d; CHEAP(); *g = 5; return OK; }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t d, unsigned *w) { (void)d; CHEAP(); *w = 16; return OK; }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t d, unsigned *w) { (void)d; CHEAP(); *w = 16; return OK; }

typedef union { double d; unsigned ui; unsigned long ul; unsigned long long ull; long long sll; int si; unsigned short us; } nvmlValue_t;
typedef struct { uint32_t fieldId, scopeId; int64_t timestamp, latencyUsec; int valueType; nvmlReturn_t nvmlReturn; nvmlValue_t value; } nvmlFieldValue_t;
enum { FI_ENERGY = 83, FI_NVLINK_LINK_COUNT = 91, FI_NVLINK_DATA_TX = 138, FI_NVLINK_DATA_RX = 139 };
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *v) {
    CHEAP();
    double t = now_s(CLOCK_MONOTONIC);
    for (int k = 0; k < 2; k++) d->nvlink_kib[k] += 40e3 * 1024 * util(d) * (t - d->nvlink_t) * (k ? 1.02 : 1.0);
    d->nvlink_t = t;
    for (int i = 0; i < count; i++) {
        v[i].timestamp = (int64_t)(t * 1e6);
        v[i].latencyUsec = 0;
        v[i].valueType = 3;                  /* unsigned long long */
        v[i].nvmlReturn = OK;
        switch (v[i].fieldId) {
            case FI_NVLINK_LINK_COUNT: v[i].valueType = 1; v[i].value.ui = NVLINKS; break;
            case FI_NVLINK_DATA_TX: v[i].value.ull = (unsigned long long)d->nvlink_kib[0]; break;
            case FI_NVLINK_DATA_RX: v[i].value.ull = (unsigned long long)d->nvlink_kib[1]; break;
            case FI_ENERGY: {
                unsigned long long mj;
                nvmlDeviceGetTotalEnergyConsumption(d, &mj);
                v[i].value.ull = mj;
                break;
            }
            default: v[i].nvmlReturn = NOT_SUPPORTED;
        }
    }
    return OK;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned *count, void *infos) {
    (void)d; (void)infos; spend(7e-6, 0); *count = 0; return OK;
}

/* ---- XID events: none ever come ---- */
typedef struct { int unused; } event_set_t;
static event_set_t the_set;
typedef struct { nvmlDevice_t device; unsigned long long eventType, eventData; unsigned gi, ci; } nvmlEventData_t;
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *t) { (void)d; *t = 0x8; return OK; }
nvmlReturn_t nvmlEventSetCreate(event_set_t **s) { *s = &the_set; return OK; }
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long t, event_set_t *s) {
    (void)d; (void)t; (void)s; return OK;
}
nvmlReturn_t nvmlEventSetWait_v2(event_set_t *s, nvmlEventData_t *e, unsigned timeout_ms) {
    (void)s; (void)e;
    if (timeout_ms) spend(0, timeout_ms * 1e-3);
    return TIMEOUT;
}
nvmlReturn_t nvmlEventSetFree(event_set_t *s) { (void)s; return OK; }

/* ---- GPM ---- */
typedef struct { unsigned version, isSupportedDevice; } nvmlGpmSupport_t;
typedef struct gpm_sample { double t; gpu_t *gpu; } gpm_sample_t;
typedef struct { const char *shortName, *longName, *unit; } metricInfo_t;
typedef struct { unsigned metricId; nvmlReturn_t nvmlReturn; double value; metricInfo_t info; } nvmlGpmMetric_t;
typedef struct { unsigned version, numMetrics; gpm_sample_t *sample1, *sample2; nvmlGpmMetric_t metrics[477]; } nvmlGpmMetricsGet_t;
nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t d, nvmlGpmSupport_t *s) { (void)d; s->isSupportedDevice = 1; return OK; }
nvmlReturn_t nvmlGpmSampleAlloc(gpm_sample_t **s) { *s = calloc(1, sizeof(gpm_sample_t)); return *s ? OK : 2; }
nvmlReturn_t nvmlGpmSampleFree(gpm_sample_t *s) { free(s); return OK; }
nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t d, gpm_sample_t *s) {
    spend(0.04e-3, 0);                       /* 0.04 ms on the H100 */
    s->t = now_s(CLOCK_MONOTONIC);
    s->gpu = d;
    return OK;
}
enum { SM_UTIL = 2, SM_OCCUPANCY = 3, ANY_TENSOR = 5, DRAM_BW = 10, PCIE_TX = 20, PCIE_RX = 21,
       NVLINK_TOTAL_RX = 60, NVLINK_TOTAL_TX = 61 };
nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *req) {
    CHEAP();
    gpm_sample_t *a = req->sample1, *b = req->sample2;
    if (!a || !b || !a->gpu || a->gpu != b->gpu || a->t == b->t) return INVALID_ARGUMENT;
    double u = util(b->gpu), sm = 100 * u * 0.96, nvl = 40e3 * u;
    for (unsigned k = 0; k < req->numMetrics && k < 477; k++) {
        nvmlGpmMetric_t *m = &req->metrics[k];
        m->nvmlReturn = OK;
        switch (m->metricId) {
            case SM_UTIL: m->value = sm; break;
            case SM_OCCUPANCY: m->value = sm * 0.45; break;
            case ANY_TENSOR: m->value = sm * 0.6; break;
            case DRAM_BW: m->value = 100 * u * 0.4; break;
            case NVLINK_TOTAL_TX: m->value = nvl; break;
            case NVLINK_TOTAL_RX: m->value = nvl * 1.02; break;
            case PCIE_TX: m->value = (9000 + 150000 * u) / 1024.0; break;
            case PCIE_RX: m->value = (19000 + 250000 * u) / 1024.0; break;
            default: m->nvmlReturn = NOT_SUPPORTED; m->value = 0;
        }
    }
    return OK;
}
