"""Modalities: the shared transformers adapter plus the text, image and speech pipelines.

Imports flow app -> modalities -> samplers -> kernels; the three modalities share code only through this
package's top level and `specgen.samplers`, never by importing each other.
"""
