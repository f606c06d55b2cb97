"""Chat templates for tests: real templates' ways, written here."""

# ChatML with tools in the manner of Qwen2.5: the tools listed in the system turn, a call
# written as JSON between <tool_call> tags (the template writes it its own way: its key
# order and spacing), consecutive tool results gathered into one user turn.
QWEN_STYLE = """
{%- if messages and messages[0].role == 'system' -%}
  {%- set system = messages[0].content -%}{%- set turns = messages[1:] -%}
{%- else -%}
  {%- set system = 'You are a helpful assistant.' -%}{%- set turns = messages -%}
{%- endif -%}
{{- '<|im_start|>system\\n' + system }}
{%- if tools %}
  {{- '\\n\\n# Tools\\n\\nFunctions you may call:\\n<tools>' }}
  {%- for tool in tools %}{{- '\\n' + tool | tojson }}{%- endfor %}
  {{- '\\n</tools>\\n\\nCall one as a JSON object of its name and arguments between '
      '<tool_call> and </tool_call>.' }}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- for message in turns %}
  {%- if message.role == 'tool' %}
    {%- if loop.first or turns[loop.index0 - 1].role != 'tool' %}
      {{- '<|im_start|>user' }}
    {%- endif %}
    {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
    {%- if loop.last or turns[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{% endif %}
  {%- elif message.role == 'assistant' %}
    {{- '<|im_start|>assistant' }}
    {%- if message.content %}{{- '\\n' + message.content }}{% endif %}
    {%- for call in message.tool_calls or [] %}
      {{- '\\n<tool_call>\\n{"name": "' + call.function.name + '", "arguments": ' }}
      {%- if call.function.arguments is string %}{{- call.function.arguments }}
      {%- else %}{{- call.function.arguments | tojson }}{% endif %}
      {{- '}\\n</tool_call>' }}
    {%- endfor %}
    {{- '<|im_end|>\\n' }}
  {%- else %}
    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{% endif %}
"""
