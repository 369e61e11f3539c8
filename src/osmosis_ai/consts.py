"""Package identity: the distribution name and its version (read by the build backend)."""

package_name = "osmosis-ai"
PACKAGE_VERSION = "0.4.0.dev0"
