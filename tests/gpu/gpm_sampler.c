/* gpm_sampler: a second GPM client, to see whether two processes can sample GPM
   at once (tests/gpu/gpm_concurrent.sh). Only libnvidia-ml.so.1, through dlopen.

   build:  gcc -O2 -o gpm_sampler gpm_sampler.c -ldl
   usage:  gpm_sampler SECONDS [WINDOW_MS] [GPU]
   Every WINDOW_MS (default 1000) it takes a GPM sample of the GPU (default 0) and
   prints one line: the time, the return codes of nvmlGpmSampleGet and
   nvmlGpmMetricsGet, and SM activity in percent. At the end a summary line:
   "windows N ok N failed N". Exit status 0 when no call failed. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef void *nvmlGpmSample_t;
typedef struct { unsigned version, isSupportedDevice; } nvmlGpmSupport_t;
typedef struct {
    unsigned metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct { char *shortName, *longName, *unit; } metricInfo;
} nvmlGpmMetric_t;
typedef struct {
    unsigned version, numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[210];
} nvmlGpmMetricsGet_t;

#define SM_UTIL 2
#define LOAD(name, ret, ...)                                                                   \
    ret (*name)(__VA_ARGS__) = (ret(*)(__VA_ARGS__))dlsym(lib, #name);                         \
    if (!name) { fprintf(stderr, "gpm_sampler: libnvidia-ml has no %s\n", #name); return 2; }

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: gpm_sampler SECONDS [WINDOW_MS] [GPU]\n");
        return 2;
    }
    double seconds = atof(argv[1]);
    int window_ms = argc > 2 ? atoi(argv[2]) : 1000;
    unsigned gpu = argc > 3 ? (unsigned)atoi(argv[3]) : 0;
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) { fprintf(stderr, "gpm_sampler: %s\n", dlerror()); return 2; }
    LOAD(nvmlInit_v2, nvmlReturn_t, void);
    LOAD(nvmlDeviceGetHandleByIndex_v2, nvmlReturn_t, unsigned, nvmlDevice_t *);
    LOAD(nvmlGpmQueryDeviceSupport, nvmlReturn_t, nvmlDevice_t, nvmlGpmSupport_t *);
    LOAD(nvmlGpmSampleAlloc, nvmlReturn_t, nvmlGpmSample_t *);
    LOAD(nvmlGpmSampleFree, nvmlReturn_t, nvmlGpmSample_t);
    LOAD(nvmlGpmSampleGet, nvmlReturn_t, nvmlDevice_t, nvmlGpmSample_t);
    LOAD(nvmlGpmMetricsGet, nvmlReturn_t, nvmlGpmMetricsGet_t *);
    LOAD(nvmlErrorString, const char *, nvmlReturn_t);

    nvmlReturn_t r = nvmlInit_v2();
    if (r) { fprintf(stderr, "gpm_sampler: nvmlInit_v2: %s\n", nvmlErrorString(r)); return 2; }
    nvmlDevice_t device;
    r = nvmlDeviceGetHandleByIndex_v2(gpu, &device);
    if (r) { fprintf(stderr, "gpm_sampler: handle: %s\n", nvmlErrorString(r)); return 2; }
    nvmlGpmSupport_t support = {1, 0};
    r = nvmlGpmQueryDeviceSupport(device, &support);
    if (r || !support.isSupportedDevice) {
        fprintf(stderr, "gpm_sampler: GPU %u: no GPM (%s)\n", gpu, nvmlErrorString(r));
        return 2;
    }
    nvmlGpmSample_t samples[2];
    if (nvmlGpmSampleAlloc(&samples[0]) || nvmlGpmSampleAlloc(&samples[1])) {
        fprintf(stderr, "gpm_sampler: nvmlGpmSampleAlloc failed\n");
        return 2;
    }
    static nvmlGpmMetricsGet_t request;
    int windows = 0, ok = 0, failed = 0, have = 0, current = 0;
    double start = now();
    struct timespec pause = {window_ms / 1000, (long)(window_ms % 1000) * 1000000L};
    while (now() - start < seconds) {
        nvmlReturn_t got = nvmlGpmSampleGet(device, samples[current]);
        double t = now() - start;
        if (got) {
            printf("%7.3f sample %s\n", t, nvmlErrorString(got));
            failed++;
            have = 0;
        } else if (have) {
            memset(&request, 0, sizeof request);
            request.version = 1;
            request.numMetrics = 1;
            request.sample1 = samples[1 - current];
            request.sample2 = samples[current];
            request.metrics[0].metricId = SM_UTIL;
            nvmlReturn_t m = nvmlGpmMetricsGet(&request);
            windows++;
            if (m || request.metrics[0].nvmlReturn) {
                printf("%7.3f metrics %s / %s\n", t, nvmlErrorString(m),
                       nvmlErrorString(request.metrics[0].nvmlReturn));
                failed++;
            } else {
                printf("%7.3f ok sm_active %.2f%%\n", t, request.metrics[0].value);
                ok++;
            }
        }
        fflush(stdout);
        if (!got) {
            have = 1;
            current = 1 - current;
        }
        nanosleep(&pause, NULL);
    }
    printf("windows %d ok %d failed %d\n", windows, ok, failed);
    nvmlGpmSampleFree(samples[0]);
    nvmlGpmSampleFree(samples[1]);
    return failed ? 1 : 0;
}
