"""The preset dictionaries of the payload's zlib framing (docs/payload.md): ``ZDICT`` for what the
encoder writes (version 3), ``ZDICT_SUMMARY`` for summary batches (version 3 with ``summary_ms``: the
``<key>:<stat>`` list of an NVIDIA GPU's summary, which the plain dictionary does not hold and which
costs a summary of 8 GPUs some 650 bytes without it), ``ZDICT_HEALTH`` for health reports (the
agent's own metric names, payload/health.py), ``ZDICT_V2`` for batches of version 2 agents still to be
read.

Frozen with the payload version: a reader needs these exact bytes to inflate what the encoder wrote, so
any edit is a new payload version. A zlib header names its dictionary by Adler-32, so a reader picks the
right one. They only make common text cheap (the JSON skeleton, catalog keys, label values and identity
fields as the backends write them, the most frequent last, where a back-reference is shortest); a string
that is not in them still travels, at its full cost.
"""

# What the dictionaries share: catalog keys and identity fields, then the document's skeleton around
# the version number, up to the device's "up" field.
_HEAD = (
    b'["temp_junction",[]],["fan_speed",[]],["retired_pages_sbe",[]],["retired_pages_dbe",[]],["multimedia'
    b'_utilization",[]],["clock_soc",[]],["clock_max_soc",[]],["clock_min_graphics",[]],["frequency_govern'
    b'or",[]],["pcie_bandwidth",[]],["ecc_block_corrected",[]],["ecc_block_uncorrected",[]],["board_power"'
    b',[]],["power_rail",[]]"info":{"name":"AMD Instinct MI300X","vbios_version":"","serial":"","pci_bus_i'
    b'd":"0000:","device":"card0","driver_version":"","vendor":"amd"},"info":{"name":"NVIDIA A100-SXM4-80G'
    b'B","serial":"","pci_bus_id":"00000000:","device":"nvidia","driver_version":"","cuda_version":"12.","'
    b'vendor":"nvidia"},"id":{"gpu":"0","uuid":"MIG-","gpu_instance":"","compute_instance":"0","mig_profil'
    b'e":"1g.10gb","parent_uuid":"GPU-"},{"values":[null,{"format":"gpu-exporter.batch","version":'
)

_MIDDLE = (
    b',"node":"","boot":"","first_seq":,"last_seq":,"seq":[1,1,1,1,1],"time_ms":[5000,5000,5000,5000,5000]'
    b',"metrics":[["clock_max_graphics",[]],["clock_max_sm",[]],["clock_max_memory",[]],["clock_max_video"'
    b',[]],["utilization",[]],["memory_utilization",[]],["encoder_utilization",[]],["decoder_utilization",'
    b'[]],["memory_total",[]],["memory_used",[]],["memory_free",[]],["memory_reserved",[]],["temp_gpu",[]]'
    b',["temp_memory",[]],["power",[]],["power_limit",[]],["energy",[]],["clock_graphics",[]],["clock_sm",'
    b'[]],["clock_memory",[]],["clock_video",[]],["performance_state",[]],["clock_event_reason",["gpu_idle'
    b'"]],["clock_event_reason",["applications_clocks_setting"]],["clock_event_reason",["sw_power_cap"]],['
    b'"clock_event_reason",["hw_slowdown"]],["clock_event_reason",["sync_boost"]],["clock_event_reason",["'
    b'sw_thermal_slowdown"]],["clock_event_reason",["hw_thermal_slowdown"]],["clock_event_reason",["hw_pow'
    b'er_brake_slowdown"]],["pcie_tx",[]],["pcie_rx",[]],["pcie_replay",[]],["pcie_link_generation",[]],["'
    b'pcie_link_width",[]],["ecc_corrected_volatile",[]],["ecc_corrected_aggregate",[]],["ecc_uncorrected_'
    b'volatile",[]],["ecc_uncorrected_aggregate",[]],["remapped_rows_correctable",[]],["remapped_rows_unco'
    b'rrectable",[]],["remapped_rows_pending",[]],["remapped_rows_failure",[]],["nvlink_tx",["0"]],["nvlin'
    b'k_rx",["0"]],["nvlink_tx",["1"]],["nvlink_rx",["1"]],["nvlink_tx",["2"]],["nvlink_rx",["2"]],["nvlin'
    b'k_tx",["3"]],["nvlink_rx",["3"]],["nvlink_tx",["4"]],["nvlink_rx",["4"]],["nvlink_tx",["5"]],["nvlin'
    b'k_rx",["5"]],["nvlink_tx",["6"]],["nvlink_rx",["6"]],["nvlink_tx",["7"]],["nvlink_rx",["7"]],["nvlin'
    b'k_tx",["8"]],["nvlink_rx",["8"]],["nvlink_tx",["9"]],["nvlink_rx",["9"]],["nvlink_tx",["10"]],["nvli'
    b'nk_rx",["10"]],["nvlink_tx",["11"]],["nvlink_rx",["11"]],["nvlink_tx",["12"]],["nvlink_rx",["12"]],['
    b'"nvlink_tx",["13"]],["nvlink_rx",["13"]],["nvlink_tx",["14"]],["nvlink_rx",["14"]],["nvlink_tx",["15'
    b'"]],["nvlink_rx",["15"]],["nvlink_tx",["16"]],["nvlink_rx",["16"]],["nvlink_tx",["17"]],["nvlink_rx"'
    b',["17"]],["processes",[]],["processes_memory",[]],["xid_errors",["48"]],["xid_errors",["63"]],["xid_'
    b'errors",["64"]],["xid_errors",["74"]],["xid_errors",["79"]],["xid_errors",["92"]],["xid_errors",["94'
    b'"]],["xid_errors",["95"]],["sm_active",[]],["sm_occupancy",[]],["tensor_active",[]],["dram_active",['
    b']],["fp64_active",[]],["fp32_active",[]],["fp16_active",[]]],"devices":[{"id":{"gpu":"0","uuid":"GPU'
    b'-"},"info":{"name":"NVIDIA H100 80GB HBM3","serial":"","pci_bus_id":"00000000:","device":"nvidia0","'
    b'driver_version":"","cuda_version":"12.","vendor":"nvidia"},"up":'
)

ZDICT_V2 = (
    _HEAD
    + b"2"
    + _MIDDLE
    + b'[1,1,1,1,1,1],"columns":[{"const":0},{"const":1},{"delta":[0,0,0,0,0,0]},"order":2,"scale":2},"scale":3},"scale":6},"step":1024},"step":1000000},"step":4096},'
)
ZDICT = (
    _HEAD
    + b"3"
    + _MIDDLE
    + b'[1,1,1,1,1,1,1,1,1,1,1,1],"columns":[0,1,null,{"ref":9,"sign":-1,"add":[0,0,0,0,0,0,0],[10,[11,[12,[13,[14,[22,1024,[20,4096,[20,1000000,[30,'
)

# A summary's metric list as summaries of a simulated NVIDIA GPU write it (gauges that moved: last, min,
# max, mean; the rest: last), then the field that follows it in a summary document.
_SUMMARY_KEYS = (
    b'["clock_max_graphics:last",[]],["clock_max_sm:last",[]],["clock_max_memory:last",[]],["clock_max_vid'
    b'eo:last",[]],["utilization:last",[]],["utilization:min",[]],["utilization:max",[]],["utilization:mea'
    b'n",[]],["memory_utilization:last",[]],["memory_utilization:min",[]],["memory_utilization:max",[]],["'
    b'memory_utilization:mean",[]],["encoder_utilization:last",[]],["encoder_utilization:min",[]],["encode'
    b'r_utilization:max",[]],["encoder_utilization:mean",[]],["decoder_utilization:last",[]],["decoder_uti'
    b'lization:min",[]],["decoder_utilization:max",[]],["decoder_utilization:mean",[]],["memory_total:last'
    b'",[]],["memory_used:last",[]],["memory_used:min",[]],["memory_used:max",[]],["memory_used:mean",[]],'
    b'["memory_free:last",[]],["memory_free:min",[]],["memory_free:max",[]],["memory_free:mean",[]],["memo'
    b'ry_reserved:last",[]],["temp_gpu:last",[]],["temp_gpu:min",[]],["temp_gpu:max",[]],["temp_gpu:mean",'
    b'[]],["temp_memory:last",[]],["temp_memory:min",[]],["temp_memory:max",[]],["temp_memory:mean",[]],["'
    b'power:last",[]],["power:min",[]],["power:max",[]],["power:mean",[]],["power_limit:last",[]],["energy'
    b':last",[]],["clock_graphics:last",[]],["clock_graphics:min",[]],["clock_graphics:max",[]],["clock_gr'
    b'aphics:mean",[]],["clock_sm:last",[]],["clock_sm:min",[]],["clock_sm:max",[]],["clock_sm:mean",[]],['
    b'"clock_memory:last",[]],["clock_video:last",[]],["clock_video:min",[]],["clock_video:max",[]],["cloc'
    b'k_video:mean",[]],["performance_state:last",[]],["clock_event_reason:last",["gpu_idle"]],["clock_eve'
    b'nt_reason:last",["applications_clocks_setting"]],["clock_event_reason:last",["sw_power_cap"]],["cloc'
    b'k_event_reason:last",["hw_slowdown"]],["clock_event_reason:last",["sync_boost"]],["clock_event_reaso'
    b'n:last",["sw_thermal_slowdown"]],["clock_event_reason:last",["hw_thermal_slowdown"]],["clock_event_r'
    b'eason:last",["hw_power_brake_slowdown"]],["clock_event_seconds_power:last",[]],["clock_event_seconds'
    b'_thermal:last",[]],["pcie_tx:last",[]],["pcie_tx:min",[]],["pcie_tx:max",[]],["pcie_tx:mean",[]],["p'
    b'cie_rx:last",[]],["pcie_rx:min",[]],["pcie_rx:max",[]],["pcie_rx:mean",[]],["pcie_replay:last",[]],['
    b'"pcie_link_generation:last",[]],["pcie_link_width:last",[]],["ecc_corrected_volatile:last",[]],["ecc'
    b'_corrected_aggregate:last",[]],["ecc_uncorrected_volatile:last",[]],["ecc_uncorrected_aggregate:last'
    b'",[]],["remapped_rows_correctable:last",[]],["remapped_rows_uncorrectable:last",[]],["remapped_rows_'
    b'pending:last",[]],["remapped_rows_failure:last",[]],["nvlink_tx:last",["0"]],["nvlink_rx:last",["0"]'
    b'],["nvlink_tx:last",["1"]],["nvlink_rx:last",["1"]],["nvlink_tx:last",["2"]],["nvlink_rx:last",["2"]'
    b'],["nvlink_tx:last",["3"]],["nvlink_rx:last",["3"]],["nvlink_tx:last",["4"]],["nvlink_rx:last",["4"]'
    b'],["nvlink_tx:last",["5"]],["nvlink_rx:last",["5"]],["nvlink_tx:last",["6"]],["nvlink_rx:last",["6"]'
    b'],["nvlink_tx:last",["7"]],["nvlink_rx:last",["7"]],["nvlink_tx:last",["8"]],["nvlink_rx:last",["8"]'
    b'],["nvlink_tx:last",["9"]],["nvlink_rx:last",["9"]],["nvlink_tx:last",["10"]],["nvlink_rx:last",["10'
    b'"]],["nvlink_tx:last",["11"]],["nvlink_rx:last",["11"]],["nvlink_tx:last",["12"]],["nvlink_rx:last",'
    b'["12"]],["nvlink_tx:last",["13"]],["nvlink_rx:last",["13"]],["nvlink_tx:last",["14"]],["nvlink_rx:la'
    b'st",["14"]],["nvlink_tx:last",["15"]],["nvlink_rx:last",["15"]],["nvlink_tx:last",["16"]],["nvlink_r'
    b'x:last",["16"]],["nvlink_tx:last",["17"]],["nvlink_rx:last",["17"]],["processes:last",[]],["processe'
    b's_memory:last",[]],["xid_errors:last",["48"]],["xid_errors:last",["63"]],["xid_errors:last",["64"]],'
    b'["xid_errors:last",["74"]],["xid_errors:last",["79"]],["xid_errors:last",["92"]],["xid_errors:last",'
    b'["94"]],["xid_errors:last",["95"]],["xid_last:last",[]],["health:last",["xid"]],["health:last",["mem'
    b'ory"]],["health:last",["pcie"]],["health:last",["thermal"]],["health:last",["power"]],["sm_active:la'
    b'st",[]],["sm_active:min",[]],["sm_active:max",[]],["sm_active:mean",[]],["sm_occupancy:last",[]],["s'
    b'm_occupancy:min",[]],["sm_occupancy:max",[]],["sm_occupancy:mean",[]],["tensor_active:last",[]],["te'
    b'nsor_active:min",[]],["tensor_active:max",[]],["tensor_active:mean",[]],["dram_active:last",[]],["dr'
    b'am_active:min",[]],["dram_active:max",[]],["dram_active:mean",[]],["fp64_active:last",[]],["fp64_act'
    b'ive:min",[]],["fp64_active:max",[]],["fp64_active:mean",[]],["fp32_active:last",[]],["fp32_active:mi'
    b'n",[]],["fp32_active:max",[]],["fp32_active:mean",[]],["fp16_active:last",[]],["fp16_active:min",[]]'
    b',["fp16_active:max",[]],["fp16_active:mean",[]],["performance_state:min",[]],["performance_state:max'
    b'",[]],["performance_state:mean",[]],["clock_event_reason:min",["gpu_idle"]],["clock_event_reason:max'
    b'",["gpu_idle"]],["clock_event_reason:mean",["gpu_idle"]],["clock_event_reason:min",["sw_power_cap"]]'
    b',["clock_event_reason:max",["sw_power_cap"]],["clock_event_reason:mean",["sw_power_cap"]],"summary_m'
    b's":'
)
ZDICT_SUMMARY = ZDICT + _SUMMARY_KEYS

# The agent's own metrics a health report carries (payload/health.py), as the agent sends them: frozen with
# ZDICT_HEALTH (a reader finds a dictionary by its Adler-32), whatever later agents send.
_HEALTH_NAMES = (
    "gpu_exporter_host_reads_stuck",
    "gpu_exporter_host_read_failures_total",
    "gpu_exporter_sampler_stale",
    "process_start_time_seconds",
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
    "gpu_exporter_build_info",
    "gpu_exporter_backend_healthy",
    "gpu_exporter_collect_errors_total",
    "gpu_exporter_collect_overruns_total",
    "gpu_exporter_collects_total",
    "gpu_exporter_collect_seconds_total",
    "gpu_exporter_ring_overwritten_total",
    "gpu_exporter_forward_connected",
    "gpu_exporter_forward_working",
    "gpu_exporter_forward_twin_suspected",
    "gpu_exporter_forward_session_takeovers_total",
    "gpu_exporter_forward_internal_errors_total",
    "gpu_exporter_forward_publish_errors_total",
    "gpu_exporter_forward_missed_samples_total",
    "gpu_exporter_forward_spool_write_errors_total",
    "gpu_exporter_forward_dropped_batches_total",
    "gpu_exporter_forward_replay_backlog_batches",
    "gpu_exporter_forward_summaries_window_seconds",
    "gpu_exporter_forward_summarizing",
    "gpu_exporter_forward_full_resolution_bytes_per_second",
    "gpu_exporter_forward_link_bytes_per_second",
    "gpu_exporter_forward_spool_oldest_age_seconds",
    "gpu_exporter_forward_spool_bytes",
    "gpu_exporter_forward_spool_batches",
    "gpu_exporter_last_collect_success_timestamp_seconds",
    "gpu_exporter_collect_duration_seconds",
)
ZDICT_HEALTH = (
    b'{"format":"gpu-exporter.batch","version":3,"node":"","boot":"","first_seq":1,"last_seq":1,"seq":[1],'
    b'"time_ms":[1764412800000],"metrics":[],"devices":[],"health":['
    + b"".join(b'["%s",[],0],' % name.encode() for name in _HEALTH_NAMES)
    + b'["gpu_exporter_build_info",["build_date","unknown","python_version","3.","revision","","version","0.'
    b'"],1],"reason","max_bytes"],"reason","max_age"],"reason","corrupt"],"reason","disk_full"],"reason","too'
    b'_large"],"evidence","reason"],"evidence","pattern"],"backend","nvidia"],"backend","amd"],"backend","jet'
    b'son"],"backend","fake"],["reason","not_regular"],["reason","timeout"],["reason","stuck"],["reason","bu'
    b'sy"],["backend","call","sampler","read"],'
)
