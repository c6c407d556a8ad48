/* A stand-in for a malicious HDF5 filter plugin: loading it creates the file named by
   SHARDKIT_TEST_PLUGIN_MARKER, so a test can tell whether any code from HDF5_PLUGIN_PATH ran. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((constructor)) static void announce_loading(void) {
  const char* marker = getenv("SHARDKIT_TEST_PLUGIN_MARKER");
  if (marker == NULL) return;
  FILE* f = fopen(marker, "w");
  if (f != NULL) fclose(f);
}
