# check_replay.cmake: run gpumem-replay --json on one trace and check its figures against bounds.
#   cmake -DREPLAY=<gpumem-replay> -DTRACE=<trace> -DMAX_RATIO=1.07 -DMAX_UNMAP=1000 [-DWARM=N] [-DEXTRA=ARGS]
#         -P check_replay.cmake
# Fails when the reserved/live ratio or the virtual-memory unmap count passes its bound. WARM: the
# figures are of the pass after N untimed ones in the same context (gpumem-replay --warm N). EXTRA:
# more gpumem-replay options, a ;-list (as --sim-lag;64).
cmake_minimum_required(VERSION 3.19) # string(JSON)
set(warm_args)
if(DEFINED WARM AND NOT WARM STREQUAL "")
  set(warm_args --warm ${WARM})
endif()
execute_process(COMMAND "${REPLAY}" --json ${warm_args} ${EXTRA} "${TRACE}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "gpumem-replay failed (${rc}): ${err}")
endif()
string(JSON t GET "${out}" traces 0)
string(JSON ratio GET "${t}" ratio)
string(JSON unmaps GET "${t}" vm_unmap_calls)
string(JSON maps GET "${t}" vm_map_calls)
message(STATUS "${TRACE}: ratio ${ratio}, vm map ${maps}, unmap ${unmaps}")
if(ratio GREATER MAX_RATIO)
  message(FATAL_ERROR "reserved/live ratio ${ratio} > ${MAX_RATIO}")
endif()
if(unmaps GREATER MAX_UNMAP)
  message(FATAL_ERROR "${unmaps} unmaps > ${MAX_UNMAP}: idle chunks are moved in the steady state")
endif()
